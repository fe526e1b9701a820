"""The backend interface: what the daemon asks of Slurm, whichever door answers.

An *allocation* is one Slurm job holding nodes of one pool (or, heterogeneous,
one component per pool) for a co-execution group; its job name is
``weave-g<group>-<pool>`` (for people: ``squeue -n``) and its comment says whose it
is, ``weave:<instance>:<group>:<pool>`` (:func:`group_comment`), so a restarted daemon
adopts what it held and nothing else (:meth:`Backend.list_allocations`: this uid's
allocations, of one instance). *Steps* run inside an allocation with ``--overlap`` so
several members' phases can share it.

Implementations: :class:`~weave_slurm.slurm.cli_backend.SlurmCliBackend` (the
Slurm commands) and :class:`~weave_slurm.slurm.local_backend.LocalBackend` (plain
processes, no Slurm). :func:`~weave_slurm.slurm.factory.make_backend` picks one.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.command_runner import PipedProcess

NAME_PREFIX = "weave-"
#: The instance tag of a weaved started without ``--instance``.
DEFAULT_INSTANCE = "default"
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9_]+\Z")
_GROUP_RE = re.compile(r"^[A-Za-z0-9_.]+\Z")
_POOL_RE = re.compile(r"^[A-Za-z0-9_.-]+\Z")
_CHARGE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")   # an account or QOS name


class AllocationState(enum.Enum):
    """Where an allocation is in its life, folded from Slurm's job states."""

    PENDING = "pending"
    RUNNING = "running"
    ENDING = "ending"
    ENDED = "ended"

    @property
    def active(self) -> bool:
        return self in (AllocationState.PENDING, AllocationState.RUNNING)


class StepState(enum.Enum):
    """Where a step is: running, or how it ended."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        return self in (StepState.COMPLETED, StepState.FAILED, StepState.CANCELLED)


@dataclass(frozen=True)
class AllocationTag:
    """What an allocation's comment says: the weaved instance that owns it, its group
    (the backend's group id) and its pool."""

    instance: str
    group_id: str
    pool: str


def group_comment(group_id: str, pool: str, instance: str = DEFAULT_INSTANCE) -> str:
    """The comment an allocation carries: ``weave:<instance>:<group>:<pool>``."""
    return f"weave:{instance}:{group_id}:{pool}"


def parse_comment(comment: str) -> AllocationTag | None:
    """What an allocation comment says, or None if weave did not write it.

    Also reads the comments of weaved before instance tags, ``weave-group=<group>,
    pool=<pool>``: their instance is the ``<instance>.`` of the group label, none being
    the default instance (so an upgraded weaved still adopts what it held).
    """
    if comment.startswith("weave:"):
        parts = comment.split(":")
        if len(parts) != 4 or not _INSTANCE_RE.match(parts[1]) \
                or not _GROUP_RE.match(parts[2]) or not _POOL_RE.match(parts[3]):
            return None
        return AllocationTag(parts[1], parts[2], parts[3])
    fields = dict(item.partition("=")[::2] for item in comment.split(",") if "=" in item)
    group, pool = fields.get("weave-group"), fields.get("pool")
    if not group or not pool:
        return None
    instance, dot, _ = group.rpartition(".")
    return AllocationTag(instance if dot and instance else DEFAULT_INSTANCE, group, pool)


@dataclass(frozen=True)
class ResourceSpec:
    """One homogeneous slice of a request: N nodes of a partition, per-node GPUs/CPUs."""

    partition: str
    node_count: int
    gpus_per_node: int = 0
    gpu_type: str | None = None
    cpus_per_node: int = 1

    def validate(self, where: str) -> None:
        for key, value, low in (("node_count", self.node_count, 1),
                                ("gpus_per_node", self.gpus_per_node, 0),
                                ("cpus_per_node", self.cpus_per_node, 1)):
            if value < low:
                raise ConfigError(f"{where}: {key}={value!r}; must be >= {low}")
        if not self.partition:
            raise ConfigError(f"{where}: partition is empty; name an h20 or h800 partition")


@dataclass(frozen=True)
class AllocationRequest:
    """Nodes for one pool of a group; several components make a heterogeneous job.

    ``account``, ``qos`` and ``time_limit_min`` are what the allocation is charged to
    (the site's ``[slurm]`` table; None: Slurm's default)."""

    group_id: str
    pool: str
    components: tuple[ResourceSpec, ...]
    time_limit_min: int | None = None
    immediate_s: int = 30
    instance: str = DEFAULT_INSTANCE  # the owning weaved's tag, in the comment
    account: str | None = None
    qos: str | None = None

    @property
    def job_name(self) -> str:
        return f"{NAME_PREFIX}g{self.group_id}-{self.pool}"

    @property
    def comment(self) -> str:
        return group_comment(self.group_id, self.pool, self.instance)

    def validate(self) -> None:
        if not _INSTANCE_RE.match(self.instance):
            raise ConfigError(f"allocation request: instance={self.instance!r}; use letters, "
                              "digits or '_'")
        if not _GROUP_RE.match(self.group_id):
            raise ConfigError(f"allocation request: group_id={self.group_id!r}; use letters, "
                              "digits, '_' or '.'")
        if not _POOL_RE.match(self.pool):
            raise ConfigError(f"allocation request: pool={self.pool!r}; use letters, digits, "
                              "'_', '.' or '-'")
        if not self.components:
            raise ConfigError(f"allocation request {self.job_name}: no components")
        for i, comp in enumerate(self.components):
            comp.validate(f"allocation request {self.job_name} component {i}")
        if self.time_limit_min is not None and self.time_limit_min < 1:
            raise ConfigError(f"allocation request {self.job_name}: time_limit_min="
                              f"{self.time_limit_min!r}; must be >= 1 or None")
        for key, name in (("account", self.account), ("qos", self.qos)):
            if name is not None and not _CHARGE_RE.match(name):
                raise ConfigError(f"allocation request {self.job_name}: {key}={name!r}; use "
                                  "1-64 letters, digits, '_', '.' or '-'")


@dataclass(frozen=True)
class AllocatedComponent:
    """One component of a granted allocation."""

    partition: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    gpu_type: str | None
    cpus: int


@dataclass(frozen=True)
class Allocation:
    """A granted (or pending) allocation as the backend sees it now."""

    alloc_id: str
    name: str
    group_id: str | None
    pool: str | None
    state: AllocationState
    components: tuple[AllocatedComponent, ...]
    instance: str | None = None  # the comment's instance tag; None: not weave's comment

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for c in self.components for n in c.nodes)

    @property
    def heterogeneous(self) -> bool:
        return len(self.components) > 1


@dataclass(frozen=True)
class StepSpec:
    """A step to run inside an allocation (``srun --overlap`` semantics)."""

    name: str
    argv: tuple[str, ...]
    ntasks: int = 1
    cpus_per_task: int = 1
    node_count: int | None = None
    nodelist: tuple[str, ...] = ()
    gpus_per_node: int = 0
    het_group: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    slurm_args: tuple[str, ...] = ()
    log_path: Path | None = None

    def validate(self) -> None:
        if not self.argv:
            raise ConfigError(f"step {self.name!r}: argv is empty; give the program to run")
        if not _POOL_RE.match(self.name):
            raise ConfigError(f"step name {self.name!r}: use letters, digits, '_', '.' or '-'")
        for key, value, low in (("ntasks", self.ntasks, 1),
                                ("cpus_per_task", self.cpus_per_task, 1),
                                ("gpus_per_node", self.gpus_per_node, 0)):
            if value < low:
                raise ConfigError(f"step {self.name!r}: {key}={value!r}; must be >= {low}")
        if self.node_count is not None and not 1 <= self.node_count <= self.ntasks:
            raise ConfigError(f"step {self.name!r}: node_count={self.node_count!r}; must be "
                              f"between 1 and ntasks={self.ntasks}")


@dataclass(frozen=True)
class StepHandle:
    """What :meth:`Backend.launch_step` returns; pass it back to poll or cancel."""

    alloc_id: str
    name: str
    launcher_pid: int


@dataclass(frozen=True)
class StepStatus:
    """A step's state and, once it has ended, its exit code."""

    state: StepState
    returncode: int | None = None


@dataclass(frozen=True)
class StepInfo:
    """A step as listed by the backend."""

    alloc_id: str
    step_id: str
    name: str
    nodes: tuple[str, ...]
    ntasks: int


@dataclass(frozen=True)
class NodeInfo:
    """One node: name, partitions, state, its GPUs, and the address weaved reaches it at
    (Slurm's ``NodeAddr``)."""

    name: str
    partitions: tuple[str, ...]
    state: str
    cpus: int
    gpu_type: str | None
    gpu_count: int
    address: str = ""


class Backend(Protocol):
    """The one interface to Slurm (or to its local stand-in)."""

    kind: str

    def allocate(self, request: AllocationRequest) -> Allocation: ...

    def release(self, alloc_id: str) -> None: ...

    def shrink(self, alloc_id: str, keep: Sequence[str]) -> None:
        """Give back every node of the running allocation but ``keep`` (Slurm: ``scontrol
        update JobId=X NodeList=...``, which ends its steps' tasks on the others); the
        allocation goes on on ``keep``. Asking again once it is done is not an error."""
        ...

    def launch_step(self, alloc_id: str, spec: StepSpec) -> StepHandle: ...

    def open_step(self, alloc_id: str, spec: StepSpec) -> PipedProcess:
        """A one-task step whose stdin and stdout are the caller's pipes (its stderr
        goes to ``spec.log_path``): a control channel to a process on a node, carried
        by Slurm's own authenticated I/O forwarding. It ends when the caller closes
        its stdin, or is killed; ``release`` of the allocation ends it too."""
        ...

    def poll_step(self, handle: StepHandle) -> StepStatus: ...

    def cancel_step(self, handle: StepHandle) -> None: ...

    def list_allocations(self, prefix: str = NAME_PREFIX, *,
                         instance: str | None = None) -> tuple[Allocation, ...]:
        """This uid's active allocations (never another user's job) whose name starts
        with ``prefix`` and, if ``instance`` is given, whose comment carries that tag:
        what a weaved owns is decided by uid and tag, the name is for people."""
        ...

    def list_steps(self, alloc_id: str) -> tuple[StepInfo, ...]: ...

    def nodes(self) -> tuple[NodeInfo, ...]: ...
