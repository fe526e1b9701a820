"""The phase entries a member's resident worker runs on a node (``module:function``).

weaved's group runner activates, through the node daemon, one of

- :func:`init_train` on the member's training node: builds the job from its seed
  (version 0) and puts its warm state (``state``) and its policy (``weights``);
- :func:`rollout` on a rollout node: installs the ``weights`` segment if it is newer
  than what the worker holds, generates one rollout through ``JobRunner.rollout``
  (refused unless the held version is the segment's) and puts it as ``traj``;
- :func:`train` on the training node: loads ``state`` unless the worker already holds
  that version, trains on ``traj`` through ``JobRunner.train`` (refused unless the
  batch is this job's, of the current version) and puts the new ``state`` and
  ``weights``;
- :func:`switch_out`, run by the node daemon's tenancy (:mod:`weave_slurm.node.tenancy`)
  before another member's phase on the node: the worker's job instances move their
  device state into their scratch segments ``device.<role>`` and free the device
  (:mod:`weave_slurm.device.instances`; docs/node.md, "Device switch").

A co-located member (docs/runtime.md, "Co-located members") runs both roles in its one
worker on its training node; each phase first switches the *other* role's instance out
(``device_role_switch`` in its result), before the incoming role is built or switched in.

A member with a staleness window ``k >= 1`` names its buffers in the argument: its
rollout reads the weights buffer ``weights.b<v % (k+1)>`` and refuses unless it holds
exactly version ``v = max(0, m - k)`` with an intact CRC32, and puts ``traj.b<m % (k+1)>``
(with its step); its training reads that buffer and refuses a batch of another step.

With long-tail migration on, the runner names the rollout (``progress``: a run id)
and its tail threshold (``tail_fraction``): the rollout then puts a tiny ``progress``
segment (index extra: run id, requests remaining and in all, ``tail``) as the job
reports its requests finishing, at most every :data:`PROGRESS_EVERY_S` and at once
when the remaining requests first fall to the threshold; the runner reads it with
``attach_info`` (docs/runtime.md, "Long-tail migration"). Nothing the job computes
depends on it.

A training gang (``world_size > 1`` in the argument) runs :func:`init_train` and
:func:`train` on every rank, each in its own resident worker on its own node, under
its node-level job (:func:`~weave_slurm.hosted.contract.rank_job`): the world is
joined on the first phase and kept (:mod:`weave_slurm.hosted.world`); each rank puts
its own shard of the training state as ``state`` on its node (index extra ``gang``:
``[rank, world_size]``); ``export_weights`` is called on every rank (a collective) and
rank 0 alone puts ``weights``; only rank 0's node gets the batch, which it hands to
the others over the world.

The JobRunner is kept in the worker between phases (the worker is resident and
serves only this job), so a warm phase neither rebuilds the model nor reloads
state; a fresh worker (after a crash) rebuilds it from the segments. The argument
is one JSON string (:class:`~weave_slurm.hosted.contract.PhaseArgs`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from weave_slurm.device import instances
from weave_slurm.errors import StateError, VersionMismatch, WeaveError
from weave_slurm.hosted.contract import (
    PROGRESS,
    PROGRESS_EVERY_S,
    STATE,
    WEIGHTS,
    PhaseArgs,
    traj_part,
)
from weave_slurm.hosted.world import gang_world, share_batch, share_weights
from weave_slurm.node import job_env
from weave_slurm.node.crc import CRC_KEY, storage_crc32
from weave_slurm.node.index import SCRATCH_KEY, JobRef, scratch_name
from weave_slurm.workloads.api import JobContext, JobRunner, Role, Trajectories, TrajectoryBatch
from weave_slurm.workloads.entry import start_job

if TYPE_CHECKING:
    from torch import Tensor

    from weave_slurm.node.node_client import NodeClient
    from weave_slurm.node.resident import PhaseContext
    from weave_slurm.node.segments import AttachedState

log = logging.getLogger(__name__)

_RUNNERS: dict[tuple[str, Role], JobRunner] = {}


def _args(ctx: PhaseContext) -> PhaseArgs:
    """The phase's arguments; the process's environment then says this rank's place, as
    Slurm and torchrun would (``node/job_env.py``) for the job's own code."""
    args = PhaseArgs.decode(ctx.args, f"phase {ctx.phase} of {ctx.job.job_id}")
    job_env.apply({**job_env.job_environment(
        node=os.environ.get("SLURMD_NODENAME") or socket.gethostname(), job_name=None,
        rank=args.rank, local_rank=args.local_rank, world_size=args.world_size,
        init_method=args.init_method, gpus=args.gpus), **dict(args.env)})
    return args


def _runner(ctx: PhaseContext, args: PhaseArgs, role: Role, *, fresh: bool = False) -> JobRunner:
    key = (ctx.job.job_id, role)
    held = _RUNNERS.get(key)
    if role is Role.ROLLOUT and held is not None and (   # a pooled member's width changed:
            held.context.rank, held.context.world_size) != (args.rank, args.world_size):
        fresh = True   # its share of the prompts is another one
    if fresh or key not in _RUNNERS:
        engine = args.engine_gpus if role is Role.ROLLOUT else None   # the layout's T
        gang: dict[str, Any] = {}
        world = gang_world(args, f"job {ctx.job.job_id}") if role is Role.TRAIN else None
        if world is not None:
            gang = {"rank": world.rank, "local_rank": args.local_rank,
                    "world_size": world.world_size, "device": world.device,
                    "group": world.group}
        elif args.world_size > 1:   # an engine of a rollout gang: no process group
            gang = {"rank": args.rank, "local_rank": args.local_rank,
                    "world_size": args.world_size}
        job_id = _owner(ctx, args).job_id    # a gang's rank: the job, not its rank
        _RUNNERS[key] = start_job(args.entry_point,
                                  JobContext(job_id, role, args.seed, args.options,
                                             engine_gpus=engine, **gang),
                                  staleness=args.staleness)
    instances.track(ctx.job.job_id, role.value, _RUNNERS[key], args.device_switch)
    return _RUNNERS[key]


def _switched_in(ctx: PhaseContext, args: PhaseArgs, role: Role, runner: JobRunner,
                 weights: Any = None) -> tuple[JobRunner, dict[str, Any] | None]:
    """The runner with its device state back (docs/node.md, "Device switch"); a fresh
    one when its switched-out state is gone from the node."""
    instances.phase_begins(ctx.job.job_id, role.value)
    try:
        return runner, instances.switch_in(ctx.job.job_id, role.value, _Scratch(ctx), weights)
    except StateError as exc:
        log.warning("%s; building the job again", exc)
        return _runner(ctx, args, role, fresh=True), None


def _other_role_out(ctx: PhaseContext, role: Role) -> dict[str, Any]:
    """A co-located member's role switch: this job's instance of the other role, if it
    holds device memory in this worker, moves to its scratch segment first (before the
    incoming role builds or switches in); what moved (empty: nothing did)."""
    report = instances.switch_out(ctx.job.job_id, _Scratch(ctx), keep=role.value)
    return {"device_role_switch": report} if report["switches"] else {}


def _drop(ctx: PhaseContext, role: Role) -> None:
    """Forget a runner that may be half-updated (its phase failed)."""
    _RUNNERS.pop((ctx.job.job_id, role), None)
    instances.forget(ctx.job.job_id, role.value)


def _device(ctx: PhaseContext, role: Role, switched: dict[str, Any] | None
            ) -> dict[str, Any]:
    """What a phase's result says of the device: the bytes this worker still holds
    there (the daemon switches it out before another member's phase), its measured
    peak and switched-out residue (GPU admission), and the switch-in."""
    out: dict[str, Any] = {"device_held_bytes": instances.held_bytes(ctx.job.job_id),
                           **instances.figures(ctx.job.job_id, role.value)}
    if switched is not None:
        out["device_switch_in"] = switched
    return out


def switch_out(ctx: PhaseContext) -> dict[str, Any]:
    """The node daemon's activation: every instance of this job that holds device memory
    moves it to its scratch segment on this node and frees it."""
    return instances.switch_out(ctx.job.job_id, _Scratch(ctx))


@dataclass(frozen=True)
class _Scratch:
    """A job's scratch segments on this node (``device.<role>``): the switched-out
    device state only its worker reads back, and checkpoints skip
    (:func:`~weave_slurm.node.index.is_scratch`)."""

    ctx: PhaseContext

    def name(self, role: str) -> str:
        return scratch_name(role)

    def get(self, role: str) -> AttachedState | None:
        return self.ctx.state.get(scratch_name(role))

    def put(self, role: str, tensors: Mapping[str, Tensor]) -> None:
        with _client() as client:
            client.put_state(self.ctx.job, scratch_name(role), tensors, 0,
                             extra={SCRATCH_KEY: True})


def _owner(ctx: PhaseContext, args: PhaseArgs) -> JobRef:
    """The job whose segments this phase reads and puts on this node: its own, or for a
    gang's rank / engine ``r >= 1`` (its own node-level job) the job it belongs to."""
    return ctx.job if args.job_id is None else JobRef(args.job_id, ctx.job.uid)


def _client() -> NodeClient:
    from weave_slurm.node.node_client import NodeClient

    return NodeClient.from_env()


def _segment(ctx: PhaseContext, name: str) -> Any:
    state = ctx.state.get(name)
    if state is None:
        raise StateError(f"job {ctx.job.job_id}: phase {ctx.phase} needs segment {name!r} "
                         f"on this node (has {sorted(ctx.state)})")
    return state


def _nbytes(tensors: dict[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def init_train(ctx: PhaseContext) -> dict[str, Any]:
    """Build the job at version 0 and put its warm state and weights on this node."""
    args = _args(ctx)
    role_switch = _other_role_out(ctx, Role.TRAIN)
    runner = _runner(ctx, args, Role.TRAIN, fresh=True)
    return {**_put_train_state(ctx, args, runner, runner.weights_version),
            **_device(ctx, Role.TRAIN, None), **role_switch}


def _put_train_state(ctx: PhaseContext, args: PhaseArgs, runner: JobRunner,
                     version: int) -> dict[str, Any]:
    """This rank's ``state`` and (rank 0; with ``shard_sync`` every node's first rank)
    the ``weights``; their sizes for the profile."""
    state, weights = runner.state_tensors(), runner.export_weights()   # both ranks: collective
    if args.shard_sync:      # every training node sends its part of the weights
        weights = share_weights(gang_world(args, f"job {args.job_id}"), weights)
    with _client() as client:
        client.put_state(ctx.job, STATE, state, version,
                         extra={"gang": [args.rank, args.world_size]})
        if args.rank == 0 or (args.shard_sync and args.local_rank == 0):
            client.put_state(ctx.job, WEIGHTS, weights, version)
    return {"version": version, "state_bytes": _nbytes(state),
            "weights_bytes": _nbytes(weights)}


def _weights(ctx: PhaseContext, args: PhaseArgs) -> Any:
    """The weights segment this rollout must read, checked (version, CRC32): its own, or
    for engine ``r >= 1`` of a rollout gang the job's on this node."""
    owner = _owner(ctx, args)
    if owner != ctx.job:
        with _client() as client:   # only the weights: the gang's slices change meanwhile
            held = client.attach(owner, {args.weights})
        seg = held.get(args.weights)
        if seg is None:
            raise StateError(f"job {args.job_id}: engine {args.rank} needs segment "
                             f"{args.weights!r} of the job on this node (has {sorted(held)})")
    else:
        seg = _segment(ctx, args.weights)
    if args.version is not None and seg.index.version != args.version:
        raise VersionMismatch(f"job {ctx.job.job_id}: weights buffer {args.weights!r} holds "
                              f"version {seg.index.version}, the rollout needs "
                              f"{args.version}")
    crc = seg.index.extra.get(CRC_KEY)
    if crc is not None and storage_crc32(seg.storage) != int(crc):
        raise StateError(f"job {ctx.job.job_id}: weights buffer {args.weights!r} "
                         f"v{seg.index.version} fails its CRC32 check (half written?)")
    return seg


def rollout(ctx: PhaseContext) -> dict[str, Any]:
    """One rollout with the weights in this node's ``weights`` segment (or named buffer)."""
    args = _args(ctx)
    seg = _weights(ctx, args)
    version = seg.index.version
    role_switch = _other_role_out(ctx, Role.ROLLOUT)
    runner = _runner(ctx, args, Role.ROLLOUT)
    if version < runner.weights_version:   # rolled back to a checkpoint: start afresh
        runner = _runner(ctx, args, Role.ROLLOUT, fresh=True)
    runner, switched = _switched_in(ctx, args, Role.ROLLOUT, runner, seg.tensors)
    if version != runner.weights_version:
        # zero-copy when the job can borrow: the segment's file is never rewritten
        # (a new version is a new file), so the mapping stays this version's bytes
        runner.import_weights(seg.tensors, version, borrow=True)
    try:
        if args.progress is None:
            batch = runner.rollout(version)
        else:
            with _client() as client:
                batch = runner.rollout(version, _Progress(client, ctx, args, version))
    except BaseException:
        _drop(ctx, Role.ROLLOUT)
        raise
    tensors = {k: v.contiguous() for k, v in batch.trajectories.tensors.items()}
    extra: dict[str, Any] = {"metrics": dict(batch.metrics)}
    if args.step is not None:
        extra["step"] = args.step
    with _client() as client:   # an engine's slice: the job's traj part on this node
        client.put_state(_owner(ctx, args), traj_part(args.traj, args.rank, args.world_size),
                         tensors, version, extra=extra)
    return {"version": version, "metrics": dict(batch.metrics),
            "traj_bytes": _nbytes(tensors), **_device(ctx, Role.ROLLOUT, switched),
            **role_switch}


class _Progress:
    """A rollout's progress reporter: puts the ``progress`` segment (see module doc)."""

    def __init__(self, client: NodeClient, ctx: PhaseContext, args: PhaseArgs,
                 version: int) -> None:
        self._client, self._ctx, self._args, self._version = client, ctx, args, version
        self._last: int | None = None
        self._at = 0.0
        self._tail = False

    def __call__(self, remaining: int, total: int) -> None:
        import torch

        if self._tail or remaining == self._last:
            return       # the runner needs nothing after the tail report
        tail = remaining <= self._args.tail_fraction * total
        now = time.monotonic()
        if not tail and self._last is not None and now - self._at < PROGRESS_EVERY_S:
            return
        self._last, self._at, self._tail = remaining, now, tail
        try:
            self._client.put_state(
                self._ctx.job, PROGRESS, {"remaining": torch.tensor([remaining, total])},
                self._version, extra={"run": self._args.progress, "remaining": remaining,
                                      "total": total, "tail": tail})
        except WeaveError as exc:   # e.g. the node's budget is full: the rollout goes on
            self._tail = True       # ... unmigrated; report no more
            log.warning("job %s: progress report failed, rollout not migrated: %s",
                        self._ctx.job.job_id, exc)


def train(ctx: PhaseContext) -> dict[str, Any]:
    """One training step on this node's ``traj``; puts the new ``state`` and ``weights``."""
    args = _args(ctx)
    state_seg = _segment(ctx, STATE)
    role_switch = _other_role_out(ctx, Role.TRAIN)
    runner, switched = _switched_in(ctx, args, Role.TRAIN, _runner(ctx, args, Role.TRAIN))
    if runner.weights_version != state_seg.index.version:
        runner = _runner(ctx, args, Role.TRAIN, fresh=True)
        runner.load_state(state_seg.tensors)
    job_id = _owner(ctx, args).job_id
    batch = share_batch(gang_world(args, f"job {job_id}"),
                        _batch(ctx, args, job_id, runner) if args.rank == 0 else None)
    try:
        version = runner.train(batch)
    except BaseException:
        _drop(ctx, Role.TRAIN)
        raise
    out = _put_train_state(ctx, args, runner, version)
    return {**out, "metrics": {**batch.trajectories.metrics, **runner.last_train_metrics},
            **_device(ctx, Role.TRAIN, switched), **role_switch}


def _batch(ctx: PhaseContext, args: PhaseArgs, job_id: str,
           runner: JobRunner) -> TrajectoryBatch:
    """The batch in this node's ``traj`` segment (rank 0), checked against the step; a
    rollout gang's slices (one segment per engine) merged in engine order."""
    if args.engines > 1:
        return runner.merge_rollouts([_part(ctx, args, job_id, runner,
                                            traj_part(args.traj, e, args.engines))
                                      for e in range(args.engines)])
    return _part(ctx, args, job_id, runner, args.traj)


def _part(ctx: PhaseContext, args: PhaseArgs, job_id: str, runner: JobRunner,
          name: str) -> TrajectoryBatch:
    traj_seg = _segment(ctx, name)
    step = traj_seg.index.extra.get("step")
    if step is not None and int(step) != runner.weights_version:
        raise VersionMismatch(f"job {job_id}: batch {name!r} is of step {step}, "
                              f"training is at step {runner.weights_version}")
    metrics = dict(traj_seg.index.extra.get("metrics", {}))
    return TrajectoryBatch(job_id, traj_seg.index.version,
                           Trajectories({k: v.clone() for k, v in traj_seg.tensors.items()},
                                        metrics))
