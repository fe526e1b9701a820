"""The site's ``[runtime]`` table: how weaved's group runtime moves data and recovers.

Every default of the group runtime is written here once (``RuntimeConfig``'s fields):
the group runner's config is a ``RuntimeConfig`` plus its own wiring
(``runtime/member.py``), weaved's group runtime and its deadlines read theirs from it,
and ``configs/site.example.toml`` documents every key.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from weave_slurm.config.reader import TableReader


class WeightTransferKind(StrEnum):
    """How the group runtime moves weights from a training node to rollout nodes."""

    AUTO = "auto"          # shm where weaved shares the host with every node, else twotier
    SHM = "shm"            # shared-memory handoff: only where weaved and all nodes share a host
    TWOTIER = "twotier"    # weave_slurm.sync through per-node sync agents (across hosts)


#: Sync modes of the two-tier transfer (``weave_slurm.sync.header.SyncMode`` on the wire).
SYNC_MODES = ("full", "delta")
DEVICE_SWITCHES = ("auto", "on", "off")
WEIGHT_TRANSFERS = tuple(k.value for k in WeightTransferKind)


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """The group runtime (docs/runtime.md).

    Weight transfer: ``weight_transfer``; ``sync_mode`` and ``sync_timeout_s`` apply to
    ``twotier``. Long-tail migration: a rollout whose remaining requests fall to
    ``tail_fraction`` of its batch frees its node for the next member's rollout.
    Recovery (docs/reliability.md): a member's own faults (a worker killed, a phase
    failing) are re-admitted from its checkpoint up to ``max_recoveries`` times, retried
    ``recovery_backoff_s`` apart, doubling up to ``recovery_backoff_max_s``; a node that
    is gone or stopping is waited for up to ``node_wait_s`` without spending that
    budget (a relaunched node daemon takes seconds to answer: ~8 s on a loaded 2-core
    VM); a member killed in its first phase starts again from scratch up to
    ``max_fresh_restarts`` times. A phase is hung after ``phase_deadline_factor`` x the
    longest one measured (the declared one before that), never before
    ``phase_deadline_floor_s``. Placement plans later decisions with what the runtime
    measured of a running member (``plan_from_measurements``, docs/placement.md); off,
    it keeps planning with the profile each job declared. ``gangs``: a member trains
    as every rank its layout places (one process per training GPU, one world:
    docs/job_api.md, "Gangs"); off, as one process on its first training node (a
    site whose nodes lack the GPUs its partitions declare, e.g. a CPU smoke test).
    ``device_switch``: when a member's worker moves its device state into the node's
    shared memory so that another member can use the GPUs (docs/node.md, "Device
    switch"): ``auto`` for CUDA devices, ``on`` on any device (a CPU test of the
    switch), ``off`` never (every resident member keeps its GPU memory).
    Re-planning running jobs (docs/daemon.md): every ``replan_interval_s`` (0: never)
    the members of the ``replan_groups`` least efficient groups are placed again, and
    after a departure (``consolidate``) the members left behind, and with each placement
    the ``recent_jobs`` running jobs placed last (0: never), as the simulator's ``weave``
    re-places recent arrivals with a new one; a re-plan is taken only
    when it pays once its moves are charged, and needs node checkpoints on a file system
    weaved shares with the nodes. A move into a group that is new or grows waits for
    its nodes while the job runs on where it is, at most ``move_wait_s`` (0: such moves
    are not taken); then it is withdrawn and the job stays.
    Nothing waits forever (docs/daemon.md, "Deadlines of a group's start"): a group's
    runtime that cannot reach a node daemon (no port said, no answer) for
    ``node_start_wait_s`` requeues its waiting jobs, each at most ``max_requeues``
    times (then it fails); munge failing (no credential, or refused) for
    ``auth_wait_s`` fails them. Their group's allocations go back to Slurm.
    """

    weight_transfer: WeightTransferKind = WeightTransferKind.AUTO
    sync_mode: str = "full"
    sync_timeout_s: float = 60.0
    long_tail_migration: bool = False
    tail_fraction: float = 0.25
    max_recoveries: int = 5
    recovery_backoff_s: float = 2.0
    recovery_backoff_max_s: float = 10.0
    node_wait_s: float = 300.0
    max_fresh_restarts: int = 2
    phase_deadline_factor: float = 4.0
    phase_deadline_floor_s: float = 60.0
    plan_from_measurements: bool = True
    gangs: bool = True
    device_switch: str = "auto"
    replan_interval_s: float = 3600.0
    replan_groups: int = 8
    consolidate: bool = True
    recent_jobs: int = 6
    move_wait_s: float = 900.0
    node_start_wait_s: float = 300.0
    auth_wait_s: float = 60.0
    max_requeues: int = 3


#: The defaults, for code that builds its own config (the runner, tests, benchmarks).
RUNTIME_DEFAULTS = RuntimeConfig()


def transfer_refusal(runtime: RuntimeConfig, remote_nodes: bool) -> str | None:
    """Why ``weight_transfer`` cannot work where the nodes are other hosts than weaved's
    (``remote_nodes``: every Slurm backend, which reaches its node daemons over TCP);
    None where it can. ``shm`` hands weights off through weaved's own ``/dev/shm``."""
    if remote_nodes and runtime.weight_transfer is WeightTransferKind.SHM:
        return ("key 'runtime.weight_transfer' = 'shm': weaved on Slurm reaches its nodes "
                "on other hosts (no shared memory to hand weights off through); valid "
                "there: auto, twotier")
    return None


def read_runtime(table: TableReader | None) -> RuntimeConfig:
    """The ``[runtime]`` table (absent: the defaults); unknown keys are errors."""
    d = RUNTIME_DEFAULTS
    if table is None:
        return d
    runtime = RuntimeConfig(
        weight_transfer=WeightTransferKind(table.string(
            "weight_transfer", d.weight_transfer.value, choices=WEIGHT_TRANSFERS)),
        sync_mode=table.string("sync_mode", d.sync_mode, choices=SYNC_MODES),
        sync_timeout_s=table.number("sync_timeout_s", d.sync_timeout_s, gt=0),
        long_tail_migration=table.boolean("long_tail_migration", d.long_tail_migration),
        tail_fraction=table.number("tail_fraction", d.tail_fraction, gt=0, le=0.99),
        max_recoveries=table.integer("max_recoveries", d.max_recoveries, ge=0),
        recovery_backoff_s=table.number("recovery_backoff_s", d.recovery_backoff_s, gt=0),
        recovery_backoff_max_s=table.number("recovery_backoff_max_s",
                                            d.recovery_backoff_max_s, gt=0),
        node_wait_s=table.number("node_wait_s", d.node_wait_s, ge=0),
        max_fresh_restarts=table.integer("max_fresh_restarts", d.max_fresh_restarts, ge=0),
        phase_deadline_factor=table.number("phase_deadline_factor", d.phase_deadline_factor,
                                           ge=1),
        phase_deadline_floor_s=table.number("phase_deadline_floor_s",
                                            d.phase_deadline_floor_s, gt=0),
        plan_from_measurements=table.boolean("plan_from_measurements",
                                             d.plan_from_measurements),
        gangs=table.boolean("gangs", d.gangs),
        device_switch=table.string("device_switch", d.device_switch,
                                   choices=DEVICE_SWITCHES),
        replan_interval_s=table.number("replan_interval_s", d.replan_interval_s, ge=0),
        replan_groups=table.integer("replan_groups", d.replan_groups, ge=1),
        consolidate=table.boolean("consolidate", d.consolidate),
        recent_jobs=table.integer("recent_jobs", d.recent_jobs, ge=0),
        move_wait_s=table.number("move_wait_s", d.move_wait_s, ge=0),
        node_start_wait_s=table.number("node_start_wait_s", d.node_start_wait_s, gt=0),
        auth_wait_s=table.number("auth_wait_s", d.auth_wait_s, gt=0),
        max_requeues=table.integer("max_requeues", d.max_requeues, ge=0))
    table.done()
    return runtime
