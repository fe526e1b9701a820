"""The rows the daemon's store holds, as frozen values."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from weave_slurm.config.job import JobSpec
from weave_slurm.daemon.states import AllocState, GroupState, JobState, StepRunState
from weave_slurm.errors import ConfigError
from weave_slurm.model.charge import Charge
from weave_slurm.model.layout import MemberLayout
from weave_slurm.model.profile import JobProfile


def _init_fields() -> frozenset[str]:
    return frozenset(f.name for f in fields(JobProfile) if f.init)


def profile_to_json(profile: JobProfile) -> str:
    """The profile's constructor fields (derived ones are recomputed when read)."""
    names = _init_fields()
    return json.dumps({k: v for k, v in asdict(profile).items() if k in names},
                      sort_keys=True)


def profile_from_json(text: str) -> JobProfile:
    """The stored profile (its layout too; a row an older weaved wrote has none)."""
    names = _init_fields()
    raw = {k: v for k, v in json.loads(text).items() if k in names}
    if raw.get("layout") is not None:
        raw["layout"] = MemberLayout.from_json(raw["layout"])
    if isinstance(raw.get("charge"), dict):
        raw["charge"] = Charge(**raw["charge"])
    raw["rollout_width_s"] = tuple((int(g), float(t)) for g, t in raw.get("rollout_width_s", ()))
    return JobProfile(**raw)


@dataclass(frozen=True)
class JobRow:
    job_id: int
    uid: int
    user: str
    name: str
    spec: JobSpec | None  # parsed at submission (None: stored by an older weaved, unreadable)
    spec_toml: str  # the spec's TOML as submitted (what ``weave show job`` shows)
    source: str
    profile: JobProfile
    state: JobState
    reason: str
    group_id: int | None
    submitted_s: float
    started_s: float | None
    ended_s: float | None
    measured: JobProfile | None = None  # the runtime's live numbers, once it has enough
    moving_from: int | None = None  # a re-plan moves it from this group (None: not moving)
    weights_sha256: str | None = None  # its final weights' digest (a completed hosted job)
    held: bool = False  # held by its user: not placed until weave release (schema 7)
    recoveries: int = 0  # its recoveries so far, across weaved restarts (schema 8)

    def readable_spec(self) -> JobSpec:
        """Its spec; ``ConfigError`` where an older weaved stored one this weave cannot read."""
        if self.spec is None:
            raise ConfigError(f"job {self.job_id}: an older weaved stored its spec, which this "
                              "one cannot read")
        return self.spec

    @property
    def plan_profile(self) -> JobProfile:
        """What placement plans with: the measured profile once there is one."""
        return self.measured if self.measured is not None else self.profile


@dataclass(frozen=True)
class MemberPlan:
    job_id: int
    rollout_pins: tuple[int, ...]
    turns: int = 1   # iterations per meta-iteration (placement.group.Member.turns)


@dataclass(frozen=True)
class GroupPlan:
    """What placement decided for a group: node counts and members in cyclic order.

    ``then``: the plan the group takes once the jobs that keep a place in it while their
    move out of it waits have left (every member not in ``then``); jobs whose move into
    the group waits for it are in ``then`` only. :meth:`without` applies it
    (docs/daemon.md, "Moves that wait for nodes").

    ``colocated``: placement co-located the group (placement.group.colocated_group): its
    members roll out on their own training nodes, it holds no rollout node and their
    pins are empty.

    ``rollout_gpus``: the group's pool, as GPUs per rollout slot: each rollout
    allocation it asks for holds that many GPUs of each of its nodes (a *share*, which
    another group's share may sit beside; daemon/allocplan.py, "Shares"). None: whole
    nodes."""

    rollout_nodes: int
    train_nodes: int
    members: tuple[MemberPlan, ...]
    then: GroupPlan | None = None
    colocated: bool = False
    rollout_gpus: int | None = None

    def to_json(self) -> str:
        return json.dumps(self._raw())

    def _raw(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "rollout_nodes": self.rollout_nodes, "train_nodes": self.train_nodes,
            "members": [{"job": m.job_id, "pins": list(m.rollout_pins),
                         **({"turns": m.turns} if m.turns != 1 else {})}
                        for m in self.members]}
        if self.colocated:
            raw["colocated"] = True
        if self.rollout_gpus is not None:
            raw["rollout_gpus"] = self.rollout_gpus
        if self.then is not None:
            raw["then"] = self.then._raw()
        return raw

    @classmethod
    def from_json(cls, text: str) -> GroupPlan:
        return cls._of(json.loads(text))

    @classmethod
    def _of(cls, raw: dict[str, Any]) -> GroupPlan:
        then, gpus = raw.get("then"), raw.get("rollout_gpus")
        return cls(int(raw["rollout_nodes"]), int(raw["train_nodes"]),
                   tuple(MemberPlan(int(m["job"]), tuple(int(p) for p in m["pins"]),
                                    int(m.get("turns", 1)))
                         for m in raw["members"]),
                   None if then is None else cls._of(then), bool(raw.get("colocated", False)),
                   None if gpus is None else int(gpus))

    @property
    def job_ids(self) -> tuple[int, ...]:
        return tuple(m.job_id for m in self.members)

    def without(self, job_ids: Collection[int]) -> GroupPlan:
        """The plan with those members taken out (of ``then`` too) and the others where
        they are; once only members of ``then`` are left, ``then``."""
        left = tuple(m for m in self.members if m.job_id not in job_ids)
        then = None if self.then is None else self.then.without(job_ids)
        if then is not None and {m.job_id for m in left} <= set(then.job_ids):
            return then
        return replace(self, members=left, then=then)

    @property
    def leaving_ids(self) -> tuple[int, ...]:
        """Members not in ``then``: the group takes it once they are out."""
        return tuple(j for j in self.job_ids if self.then and j not in self.then.job_ids)

    @property
    def next_ids(self) -> tuple[int, ...]:
        """Jobs that join the group only with ``then`` (their moves wait for it)."""
        return tuple(j for j in (self.then.job_ids if self.then else ())
                     if j not in self.job_ids)


@dataclass(frozen=True)
class GroupRow:
    group_id: int
    label: str  # the backend's group id (in allocation names and comments)
    state: GroupState
    plan: GroupPlan
    created_s: float
    reason: str


@dataclass(frozen=True)
class AllocRow:
    key: int
    group_id: int
    role: str  # "rollout" or "train"
    pool: str  # label in the allocation's name/comment, e.g. "h20-0"
    partition: str
    node_count: int
    gpus_per_node: int
    gpu_type: str | None
    cpus_per_node: int
    state: AllocState
    alloc_id: str | None
    nodes: tuple[str, ...]
    reason: str
    # what it is charged to (the site's [slurm] table when it was asked for)
    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None
    #: nodes given back to Slurm while the rest is held (a shrink by nodes,
    #: daemon/allocplan.py "Spare nodes"); their slots are retired
    gone: tuple[str, ...] = ()
    #: when each of ``gone`` was given back (store time; accounting charges it until then)
    gone_s: tuple[float, ...] = ()

    @property
    def held_count(self) -> int:
        """How many nodes it holds or asks for: its node count less those given back."""
        return self.node_count - len(self.gone)

    @property
    def held_nodes(self) -> tuple[str, ...]:
        """Its nodes Slurm still gives it (all but those given back)."""
        return tuple(n for n in self.nodes if n not in self.gone)


def by_group(rows: Iterable[AllocRow]) -> dict[int, list[AllocRow]]:
    """Allocation ``rows`` by their group id, each group's in the order given."""
    out: dict[int, list[AllocRow]] = {}
    for a in rows:
        out.setdefault(a.group_id, []).append(a)
    return out


@dataclass(frozen=True)
class StepRow:
    key: int
    alloc_key: int
    job_id: int | None  # None: the allocation's node-daemon step
    name: str
    state: StepRunState
    launcher_pid: int | None
    reason: str


@dataclass(frozen=True)
class TransitionRow:
    ts: float
    entity: str
    key: str
    src: str | None
    dst: str
    reason: str


@dataclass(frozen=True)
class UsageRow:
    """A job's usage so far (daemon/usage_meter.py; docs/accounting.md): its share of its
    group's allocations in GPU- and node-seconds per role, seconds in each phase, its
    share of the cost (the site's currency) and the Slurm job ids it was charged for."""

    job_id: int
    group_id: int | None
    gpu_s: dict[str, float]      # role (rollout, train) -> GPU-seconds
    node_s: dict[str, float]     # role -> node-seconds
    phase_s: dict[str, float]    # phase (rollout, sync, train) -> seconds
    cost: float
    alloc_ids: tuple[str, ...]
    updated_s: float


@dataclass(frozen=True)
class UsageMark:
    """How far a group's allocations are booked (``until_s``; ``closed``: released and
    booked to the end) and what was held while no member was in it (unattributed)."""

    group_id: int
    until_s: float
    closed: bool = False
    idle_gpu_s: dict[str, float] = field(default_factory=lambda: {"rollout": 0.0,
                                                                   "train": 0.0})
    idle_cost: float = 0.0
