"""What weaved's group runner and a node's resident worker agree on (pure, no torch).

- The segments of a hosted job on its nodes: ``state`` (training state, training
  node), ``weights`` (the policy, every node), ``traj`` (a rollout's batch, moved to
  the training node), ``progress`` (a rollout's remaining requests, for long-tail
  migration).
- A member with a staleness window ``k >= 1`` keeps rings of ``k + 1`` buffers
  (``weights.b<v % (k+1)>``, ``traj.b<m % (k+1)>``); a copied weights buffer carries
  its source's CRC32 under :data:`~weave_slurm.node.crc.CRC_KEY` in its index.
- :class:`PhaseArgs`: the one JSON argument of every phase entry.
- :func:`rollout_version`: the weights version the rollout of a step must use.
- :func:`rank_job`: the node-level job of a training gang's rank (its own worker,
  segments and checkpoints on its node).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from weave_slurm.config.runtime import RUNTIME_DEFAULTS
from weave_slurm.errors import ConfigError

#: ``module:`` prefix of the phase entries a resident worker runs.
ENTRY_MODULE = "weave_slurm.hosted.phases"

STATE = "state"
WEIGHTS = "weights"
TRAJ = "traj"
PROGRESS = "progress"
WEIGHTS_BUFFER = "weights.b"    # + slot: the ring of weight buffers (k >= 1)
TRAJ_BUFFER = "traj.b"          # + slot: the ring of trajectory batches (k >= 1)
#: Least time between two progress reports of a rollout (the tail report is never held).
PROGRESS_EVERY_S = 0.05
#: A rollout is in its tail once its remaining requests fall to this fraction of its
#: batch: the site's ``[runtime] tail_fraction`` (the runner sends it with every rollout;
#: this default only reads arguments that lack it).
DEFAULT_TAIL_FRACTION = RUNTIME_DEFAULTS.tail_fraction


def entry(fn: str) -> str:
    """The ``module:function`` of a phase entry (``init_train``, ``rollout``, ``train``)."""
    return f"{ENTRY_MODULE}:{fn}"


def rank_job(job_id: str, rank: int) -> str:
    """The job id a node daemon knows rank ``rank`` of ``job_id``'s training gang by.

    Rank 0 is the job itself (its ``state``, ``weights`` and batches, as for a single
    rank); rank ``r >= 1`` is ``<job>.r<r>``, registered on its own node with the job's
    uid: its own resident worker, its own ``state`` shard and its own checkpoints.
    """
    return job_id if rank == 0 else f"{job_id}{RANK_SUFFIX}{rank}"


#: What separates a job id from a gang rank's number in :func:`rank_job`.
RANK_SUFFIX = ".r"
#: ... and from a rollout engine's number in :func:`engine_job`.
ENGINE_SUFFIX = ".e"


def engine_job(job_id: str, engine: int) -> str:
    """The job id a rollout node's daemon knows engine ``engine`` of ``job_id`` by
    (engine 0: the job itself). An engine reads the job's ``weights`` on its node and
    puts its slice of the batch there as the job's :func:`traj_part`."""
    return job_id if engine == 0 else f"{job_id}{ENGINE_SUFFIX}{engine}"


def traj_part(traj: str, engine: int, engines: int) -> str:
    """The segment of engine ``engine``'s slice of batch ``traj`` (one engine: ``traj``)."""
    return traj if engines == 1 else f"{traj}{ENGINE_SUFFIX}{engine}"


def rollout_version(step: int, staleness: int) -> int:
    """The weights version the rollout of ``step`` uses: exactly ``max(0, step - k)``.

    Exactly that version, not the newest one on the node: the batch then depends only
    on the job's seed and its window, never on how the group interleaved its phases,
    so a stale member learns what it would learn alone.
    """
    return max(0, step - staleness)


def buffer_name(prefix: str, index: int, staleness: int) -> str:
    """The ring buffer holding weights version / batch step ``index`` (k >= 1)."""
    return f"{prefix}{index % (staleness + 1)}"


@dataclass(frozen=True)
class PhaseArgs:
    """What the runner passes to every entry.

    A member with a staleness window (``staleness >= 1``) also names the weights
    buffer its rollout must read and the exact version it must hold
    (``weights``/``version``), and the trajectory buffer of the batch (``traj``) with
    its step (``step``); the defaults are the on-policy segments.
    """

    entry_point: str
    seed: int
    options: dict[str, Any]
    staleness: int = 0
    weights: str = WEIGHTS
    version: int | None = None
    traj: str = TRAJ
    step: int | None = None
    progress: str | None = None         # run id: report progress (long-tail migration)
    tail_fraction: float = DEFAULT_TAIL_FRACTION   # "tail" once remaining <= this x all
    engine_gpus: int = 1                # GPUs per rollout engine (the member's layout)
    # a gang (docs/job_api.md, "Gangs"): this rank (a rollout: this engine), its GPU on
    # its node, the gang's size and where a training gang's world meets
    # (``tcp://host:port``, chosen by the runtime; None for a single rank and for
    # engines, which never communicate); the world is formed once per worker and kept
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    init_method: str | None = None
    world_timeout_s: float = 120.0      # forming the world and each collective
    job_id: str | None = None           # the job a gang's rank r >= 1 belongs to
    engines: int = 1                    # rollout slices a training step merges
    # a gang over several nodes whose weights go out from every training node (a sharded
    # two-tier sync): each node's first rank puts the full ``weights`` there too
    shard_sync: bool = False
    # when the worker moves its device state to the node's shm for another member
    # (weave_slurm.device.switch.SwitchMode: auto = CUDA devices only, on, off)
    device_switch: str = "auto"
    # the job's own variables besides a rank's place (an array element's SLURM_ARRAY_*:
    # config/job_array.py), put into the worker's environment for the phase
    env: tuple[tuple[str, str], ...] = ()
    # the member's GPUs on this rank's node (its CUDA_VISIBLE_DEVICES: node/job_env.py;
    # None: not known, left as it is)
    gpus: int | None = None

    def encode(self) -> str:
        return json.dumps({"entry_point": self.entry_point, "seed": self.seed,
                           "options": self.options, "staleness": self.staleness,
                           "weights": self.weights, "version": self.version,
                           "traj": self.traj, "step": self.step,
                           "progress": self.progress, "tail_fraction": self.tail_fraction,
                           "engine_gpus": self.engine_gpus, "rank": self.rank,
                           "local_rank": self.local_rank, "world_size": self.world_size,
                           "init_method": self.init_method,
                           "world_timeout_s": self.world_timeout_s,
                           "job_id": self.job_id, "engines": self.engines,
                           "shard_sync": self.shard_sync,
                           "device_switch": self.device_switch,
                           "env": dict(self.env), "gpus": self.gpus},
                          sort_keys=True)

    @classmethod
    def decode(cls, args: Sequence[str], where: str) -> PhaseArgs:
        if len(args) != 1:
            raise ConfigError(f"{where}: expected one JSON argument, got {len(args)}")
        raw = json.loads(args[0])
        version, step = raw.get("version"), raw.get("step")
        progress, init, job = raw.get("progress"), raw.get("init_method"), raw.get("job_id")
        return cls(str(raw["entry_point"]), int(raw["seed"]), dict(raw["options"]),
                   int(raw.get("staleness", 0)), str(raw.get("weights", WEIGHTS)),
                   None if version is None else int(version), str(raw.get("traj", TRAJ)),
                   None if step is None else int(step),
                   None if progress is None else str(progress),
                   float(raw.get("tail_fraction", DEFAULT_TAIL_FRACTION)),
                   int(raw.get("engine_gpus", 1)), int(raw.get("rank", 0)),
                   int(raw.get("local_rank", 0)), int(raw.get("world_size", 1)),
                   None if init is None else str(init),
                   float(raw.get("world_timeout_s", 120.0)),
                   None if job is None else str(job), int(raw.get("engines", 1)),
                   bool(raw.get("shard_sync", False)),
                   str(raw.get("device_switch", "auto")),
                   tuple((str(k), str(v)) for k, v in dict(raw.get("env") or {}).items()),
                   None if raw.get("gpus") is None else int(raw["gpus"]))
