"""The RL job API: what a user's job implements, and the one place that enforces on-policy.

A user job implements :class:`RLJob` (six small methods, no version bookkeeping). The
runtime never calls it directly: it wraps it in a :class:`JobRunner`, which

- tags every rollout with ``(job id, weight version that produced it)``
  (:class:`TrajectoryBatch`),
- refuses, with :class:`~weave_slurm.errors.VersionMismatch`, a rollout at a version
  the runner does not hold and a training step on a batch from another job or from a
  weight version outside the staleness window (default 0: strictly on-policy),
- counts weight versions (each ``train`` makes version ``v + 1``),
- packs warm state (weights, optimizer state, RNG, data position) with the version into
  one flat ``dict[str, Tensor]`` that the node's shared-memory store can hold, and
- writes and reads checkpoints.

Determinism contract for implementers: ``generate`` may depend only on
``(seed, weights_version, weights)`` and ``update`` only on ``(trajectories, state)``,
so that the rollout and training roles may live in different processes and a
co-executed job learns exactly what it would learn alone.

Gangs: a role may span many ranks (:class:`JobContext` ``rank``, ``world_size``,
``group``). The runtime forms the world before ``setup`` and keeps it across every
phase; a job never creates or destroys it. ``update``, ``export_weights`` and
``state_tensors`` of a training gang are collectives (every rank calls them, in the
same order); ``generate`` of an engine returns that engine's slice of the batch, and
:meth:`JobRunner.merge_rollouts` joins the slices in rank order (docs/job_api.md,
"Gangs"; helpers in :mod:`weave_slurm.workloads.gang_api`).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from weave_slurm.config.job import options_dict
from weave_slurm.device.protocols import OffloadsDevice as OffloadsDevice
from weave_slurm.device.protocols import SwitchesDevice as SwitchesDevice
from weave_slurm.errors import ConfigError, StateError, VersionMismatch
from weave_slurm.vocab import member_of
from weave_slurm.workloads.trajectories import Trajectories as Trajectories
from weave_slurm.workloads.trajectories import TrajectoryBatch as TrajectoryBatch
from weave_slurm.workloads.trajectories import concat_trajectories

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

    from weave_slurm.workloads.gang_api import WeightShard

log = logging.getLogger(__name__)

#: Key under which :meth:`JobRunner.state_tensors` stores the weight version.
VERSION_KEY = "weave.weights_version"
_CHECKPOINT_STATE = "state.pt"
_CHECKPOINT_META = "meta.json"
_CHECKPOINT_FORMAT = 1

#: ``fn(remaining, total)``: how many of a rollout's requests are still decoding.
ProgressFn = Callable[[int, int], None]
_PROGRESS: list[ProgressFn] = []


def report_progress(remaining: int, total: int) -> None:
    """Called by a job's ``generate`` as its requests finish (optional for a job).

    A no-op unless the runtime listens (:meth:`JobRunner.rollout` with ``progress``):
    the group runner uses it to spot a rollout's long tail (docs/runtime.md). It
    must not change what ``generate`` computes.
    """
    if _PROGRESS:
        _PROGRESS[-1](remaining, total)


@contextlib.contextmanager
def _listening(fn: ProgressFn | None) -> Iterator[None]:
    if fn is None:
        yield
        return
    _PROGRESS.append(fn)
    try:
        yield
    finally:
        _PROGRESS.pop()


class Role(enum.Enum):
    """Which pool a job instance serves."""

    ROLLOUT = "rollout"
    TRAIN = "train"

    @classmethod
    def parse(cls, value: str) -> Role:
        return member_of(cls, value, "role: unknown value {value} (valid: {choices})")


@dataclass(frozen=True)
class JobContext:
    """Everything ``RLJob.setup`` receives.

    ``options`` is the job-specific ``[options]`` table of the job spec, nested tables
    as dicts and lists as lists, whatever form it arrived in (the spec's frozen tuples,
    or those after a JSON trip: :func:`~weave_slurm.config.job.options_dict`); the job
    validates it strictly and rejects unknown keys.

    The rest is the instance's place in its role's gang; the defaults are a single
    rank. ``rank`` (``0 <= rank < world_size``) and ``local_rank`` (its index on its
    node) are this process's; ``world_size`` counts the role's ranks (training: one
    per GPU in one torch.distributed world; rollout: one per engine); ``device`` is
    the rank's device (``"cpu"``, ``"cuda:0"``); ``group`` is the role's
    ``torch.distributed`` process group, ``None`` for a single rank (and allowed for
    engines that never communicate). The runtime forms the world before ``setup`` and
    keeps it across phases: a job must neither create nor destroy it.
    """

    job_id: str
    role: Role
    seed: int
    options: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    group: ProcessGroup | None = field(default=None, compare=False)
    # rollout: GPUs per engine in the member's layout (vLLM's tensor_parallel_size);
    # None: not given by a runtime (the job's own options decide)
    engine_gpus: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", options_dict(self.options))
        for name in ("rank", "local_rank", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"job {self.job_id}: {name} must be an integer >= 0, "
                                  f"got {value!r}")
        if not (self.world_size >= 1 and self.rank < self.world_size
                and self.local_rank < self.world_size):
            raise ConfigError(f"job {self.job_id}: rank {self.rank} (local "
                              f"{self.local_rank}) is outside a gang of world_size "
                              f"{self.world_size} (valid: 0..{self.world_size - 1})")
        e = self.engine_gpus
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e < 1):
            raise ConfigError(f"job {self.job_id}: engine_gpus must be an integer >= 1 or "
                              f"None, got {e!r}")
        if not isinstance(self.device, str) or not self.device:
            raise ConfigError(f"job {self.job_id}: device must be a device name such as "
                              f"'cpu' or 'cuda:0', got {self.device!r}")
        if self.group is not None:
            size, rank = self.group.size(), self.group.rank()
            if (size, rank) != (self.world_size, self.rank):
                raise ConfigError(f"job {self.job_id}: the process group is rank {rank} of "
                                  f"{size}, the context says rank {self.rank} of "
                                  f"{self.world_size}")

    def share(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share ``[lo, hi)`` of ``n`` items (its prompts, its rows)."""
        from weave_slurm.workloads.gang_api import share_bounds

        return share_bounds(n, self.world_size, self.rank)


@runtime_checkable
class RLJob(Protocol):
    """The protocol a user's RL job implements (see docs/job_api.md)."""

    def setup(self, ctx: JobContext) -> None:
        """Build the model (deterministically from ``ctx.seed``) for ``ctx.role``."""

    def generate(self, weights_version: int) -> Trajectories:
        """Rollout with the current weights; randomness derived from (seed, version)."""
        ...

    def update(self, trajectories: Trajectories) -> Mapping[str, float]:
        """One training step on a batch; returns scalar metrics (loss, kl, ...)."""
        ...

    def export_weights(self) -> dict[str, Tensor]:
        """The policy weights to ship from the training to the rollout pool."""
        ...

    def import_weights(self, tensors: Mapping[str, Tensor]) -> None:
        """Install weights produced by ``export_weights`` of a peer instance."""

    def state_tensors(self) -> dict[str, Tensor]:
        """Complete warm state: weights, optimizer state, RNG, data position."""
        ...

    def load_state(self, tensors: Mapping[str, Tensor]) -> None:
        """Restore what ``state_tensors`` returned (possibly from another process)."""


@runtime_checkable
class BorrowsWeights(Protocol):
    """Optional: a rollout-role job that can run on weights it does not own.

    ``borrow_weights`` binds the job's parameters to ``tensors`` without copying them
    (e.g. ``load_state_dict(..., assign=True)``). The runtime passes read-only views of
    a node's ``/dev/shm`` weights segment, whose file is never rewritten in place (a new
    version is a new file), so a warm rollout switch costs no copy of the weights and
    the worker holds no private copy of them. The job must never write into them.
    """

    def borrow_weights(self, tensors: Mapping[str, Tensor]) -> None: ...


@runtime_checkable
class MergesTrajectories(Protocol):
    """Optional: how the rollout slices of a job's engines become one batch.

    ``parts`` are the engines' ``generate`` results in rank order. Without the method,
    :func:`~weave_slurm.workloads.trajectories.concat_trajectories` concatenates the tensors
    and averages the metrics by rows.
    """

    def merge_trajectories(self, parts: Sequence[Trajectories]) -> Trajectories: ...


@runtime_checkable
class ExportsWeightShard(Protocol):
    """Optional, training gangs: this rank's shard of the policy weights, for a sharded
    weight sync (:func:`~weave_slurm.workloads.gang_api.assemble_weights` rebuilds them).
    Local: no collective."""

    def export_weight_shard(self) -> WeightShard: ...


class JobRunner:
    """Wraps an :class:`RLJob`: version tagging, the on-policy check, warm state, checkpoints.

    ``staleness`` is the hook for bounded off-policy training: a batch from version
    ``b`` is accepted at version ``v`` when ``v - staleness <= b <= v``. The default 0
    is the synchronous on-policy contract.
    """

    def __init__(self, job: RLJob, ctx: JobContext, *, staleness: int = 0) -> None:
        if staleness < 0:
            raise ConfigError(f"staleness: must be >= 0, got {staleness!r}")
        self._job = job
        self._ctx = ctx
        self._staleness = staleness
        self._version = 0
        self.last_train_metrics: dict[str, float] = {}
        job.setup(ctx)

    @property
    def job(self) -> RLJob:
        return self._job

    @property
    def job_id(self) -> str:
        return self._ctx.job_id

    @property
    def role(self) -> Role:
        return self._ctx.role

    @property
    def context(self) -> JobContext:
        return self._ctx

    @property
    def weights_version(self) -> int:
        return self._version

    @property
    def staleness(self) -> int:
        return self._staleness

    # -- phases ---------------------------------------------------------------------
    def rollout(self, weights_version: int, progress: ProgressFn | None = None,
                ) -> TrajectoryBatch:
        """Generate with the held weights; ``weights_version`` must be the held version.

        ``progress`` hears the job's :func:`report_progress` calls during ``generate``.
        """
        if weights_version != self._version:
            raise VersionMismatch(
                f"job {self.job_id}: rollout asked for weights version {weights_version!r} "
                f"but this instance holds version {self._version} (import_weights first)")
        with _listening(progress):
            trajectories = self._job.generate(weights_version)
        return TrajectoryBatch(self.job_id, weights_version, trajectories)

    def accepts(self, batch: TrajectoryBatch) -> bool:
        """The staleness window: may a batch from ``batch.weights_version`` train now?"""
        return (batch.job_id == self.job_id
                and self._version - self._staleness <= batch.weights_version <= self._version)

    def train(self, batch: TrajectoryBatch) -> int:
        """One training step; returns the new weight version. Refuses off-policy batches."""
        if batch.job_id != self.job_id:
            raise VersionMismatch(
                f"job {self.job_id}: refusing a trajectory batch of job {batch.job_id!r}")
        if not self.accepts(batch):
            low = self._version - self._staleness
            window = (f"version {self._version}" if self._staleness == 0
                      else f"versions {low}..{self._version}")
            raise VersionMismatch(
                f"job {self.job_id}: refusing a batch from weights version "
                f"{batch.weights_version!r}; training holds {window} (staleness "
                f"{self._staleness})")
        self.last_train_metrics = dict(self._job.update(batch.trajectories))
        self._version += 1
        return self._version

    def merge_rollouts(self, batches: Sequence[TrajectoryBatch]) -> TrajectoryBatch:
        """The engines' rollout slices (``batches``, in engine rank order) as one batch.

        Refuses slices of another job or of different weight versions.
        """
        if not batches:
            raise StateError(f"job {self.job_id}: merge_rollouts of no batches")
        versions = sorted({b.weights_version for b in batches})
        others = sorted({b.job_id for b in batches} - {self.job_id})
        if others or len(versions) > 1:
            raise VersionMismatch(f"job {self.job_id}: refusing to merge rollout slices of "
                                  f"jobs {others} / weight versions {versions}")
        parts = [b.trajectories for b in batches]
        job: object = self._job
        merged = (job.merge_trajectories(parts) if isinstance(job, MergesTrajectories)
                  else concat_trajectories(parts))
        return TrajectoryBatch(self.job_id, versions[0], merged)

    # -- weight sync ----------------------------------------------------------------
    def export_weights(self) -> dict[str, Tensor]:
        return self._job.export_weights()

    def export_weight_shard(self) -> WeightShard:
        """This rank's weight shard, for jobs that implement :class:`ExportsWeightShard`."""
        job: object = self._job
        if not isinstance(job, ExportsWeightShard):
            raise StateError(f"job {self.job_id}: {type(job).__name__} has no "
                             "export_weight_shard(); sync its export_weights() instead")
        return job.export_weight_shard()

    def import_weights(self, tensors: Mapping[str, Tensor], version: int, *,
                       borrow: bool = False) -> bool:
        """Install weights of ``version``; versions never go backwards.

        ``borrow``: the tensors are immutable shared memory the caller keeps alive; a
        job that implements :class:`BorrowsWeights` binds to them without a copy (the
        return value says whether it did); any other job is handed private copies (it
        may keep references to what it imports).
        """
        if version < self._version:
            raise VersionMismatch(
                f"job {self.job_id}: import of weights version {version!r} is older than "
                f"the held version {self._version}")
        job: object = self._job
        if borrow and isinstance(job, BorrowsWeights):
            job.borrow_weights(tensors)
            self._version = version
            return True
        self._job.import_weights({k: v.clone() for k, v in tensors.items()} if borrow
                                 else tensors)
        self._version = version
        return False

    # -- warm state -----------------------------------------------------------------
    def state_tensors(self) -> dict[str, Tensor]:
        """The job's warm state plus the weight version, as one flat tensor dict."""
        import torch

        state = self._job.state_tensors()
        if VERSION_KEY in state:
            raise StateError(f"job {self.job_id}: state key {VERSION_KEY!r} is reserved")
        state[VERSION_KEY] = torch.tensor(self._version, dtype=torch.int64)
        return state

    def load_state(self, tensors: Mapping[str, Tensor]) -> None:
        if VERSION_KEY not in tensors:
            raise StateError(f"job {self.job_id}: warm state lacks {VERSION_KEY!r}")
        rest = {k: v for k, v in tensors.items() if k != VERSION_KEY}
        self._job.load_state(rest)
        self._version = int(tensors[VERSION_KEY].item())

    # -- checkpoints ----------------------------------------------------------------
    def checkpoint(self, directory: str | os.PathLike[str]) -> Path:
        """Write the warm state to ``directory`` atomically (state file, then meta)."""
        import torch

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / (_CHECKPOINT_STATE + ".tmp")
        torch.save(self.state_tensors(), tmp)
        os.replace(tmp, path / _CHECKPOINT_STATE)
        meta = {"format": _CHECKPOINT_FORMAT, "job_id": self.job_id,
                "weights_version": self._version}
        tmp_meta = path / (_CHECKPOINT_META + ".tmp")
        tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp_meta, path / _CHECKPOINT_META)
        log.info("job %s: checkpoint of version %d in %s", self.job_id, self._version, path)
        return path

    def restore(self, directory: str | os.PathLike[str]) -> int:
        """Load a checkpoint written by :meth:`checkpoint`; returns its weight version."""
        import torch

        path = Path(directory)
        meta_path = path / _CHECKPOINT_META
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            raise StateError(f"{meta_path}: no checkpoint here (missing meta file)") from None
        except json.JSONDecodeError as exc:
            raise StateError(f"{meta_path}: corrupt checkpoint meta: {exc}") from None
        if meta.get("format") != _CHECKPOINT_FORMAT:
            raise StateError(f"{meta_path}: format {meta.get('format')!r} unsupported "
                             f"(valid: {_CHECKPOINT_FORMAT})")
        if meta.get("job_id") != self.job_id:
            raise StateError(f"{meta_path}: checkpoint of job {meta.get('job_id')!r}, "
                             f"not {self.job_id!r}")
        state = torch.load(path / _CHECKPOINT_STATE, weights_only=True)
        self.load_state(state)
        return self._version
