"""Values the group runtime works on: members, nodes, phases, member states.

A *group* here is what the placement engine decided (members in cyclic round-robin
order, each pinned to some of the group's rollout nodes) plus the node daemons that
serve the group's nodes. Everything is frozen; the runner keeps the live state.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from weave_slurm.config.job import MAX_STALENESS
from weave_slurm.errors import ConfigError
from weave_slurm.hosted.contract import (
    TRAJ_BUFFER,
    WEIGHTS_BUFFER,
    PhaseArgs,
    buffer_name,
    rollout_version,
)
from weave_slurm.model.layout import MemberLayout, RolloutLayout
from weave_slurm.placement.cyclic import MAX_TURNS
from weave_slurm.runtime.launch_plan import LaunchPlan
from weave_slurm.runtime.pool import pool_layout, validate_pooled
from weave_slurm.vocab import Phase, Pool


class MemberState(enum.Enum):
    """Where a member is; transitions in :data:`TRANSITIONS`."""

    STARTING = "starting"        # warm state being put on its nodes
    READY = "ready"              # waiting for a pool
    ROLLOUT = "rollout"          # a rollout runs (and no training)
    TRAIN = "train"              # a training step runs (a stale member: maybe a rollout too)
    RECOVERING = "recovering"    # a phase failed; re-admitted from its checkpoint
    DONE = "done"                # reached its step count
    FAILED = "failed"            # gave up (recovery attempts exhausted)
    CANCELLED = "cancelled"      # left the group; its processes and state are gone
    MOVED = "moved"              # handed off to another group at a step boundary (a
                                 # re-plan): checkpointed, it runs nothing here any more


#: Allowed transitions, one comment per edge.
TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    # state put on the nodes -> waits for the rollout pool; cancel before it ran; its
    # first phase failed for good; killed (or its node lost) in its first phase, so it
    # will start again from scratch; adopted with warm state a previous weaved left;
    # a re-plan moved it before it ran (nothing learned: it starts afresh there)
    MemberState.STARTING: frozenset({MemberState.READY, MemberState.CANCELLED,
                                     MemberState.FAILED, MemberState.RECOVERING,
                                     MemberState.MOVED}),
    # the pool picked it for rollout or training; it reached its steps; its phase
    # could not be started (node gone); it left; a re-plan moved it to another group
    MemberState.READY: frozenset({MemberState.ROLLOUT, MemberState.TRAIN, MemberState.DONE,
                                  MemberState.RECOVERING, MemberState.CANCELLED,
                                  MemberState.MOVED}),
    # rollout ended (trajectories moved) or failed or was cancelled; a stale member
    # (staleness >= 1) started its training while this rollout runs
    MemberState.ROLLOUT: frozenset({MemberState.READY, MemberState.TRAIN,
                                    MemberState.RECOVERING, MemberState.CANCELLED}),
    # train ended (weights synced) or failed or was cancelled; a stale member's
    # training ended while its next rollout still runs
    MemberState.TRAIN: frozenset({MemberState.READY, MemberState.ROLLOUT, MemberState.DONE,
                                  MemberState.RECOVERING, MemberState.CANCELLED}),
    # restored from its checkpoint (ready again) or gave up; no checkpoint yet, so it
    # starts again from scratch
    MemberState.RECOVERING: frozenset({MemberState.READY, MemberState.FAILED,
                                       MemberState.CANCELLED, MemberState.STARTING}),
    MemberState.DONE: frozenset({MemberState.CANCELLED}),
    MemberState.FAILED: frozenset({MemberState.CANCELLED}),
    MemberState.CANCELLED: frozenset(),
    # the group it moved to adopted its checkpoint: it leaves this one
    MemberState.MOVED: frozenset({MemberState.CANCELLED}),
}


@dataclass(frozen=True)
class NodeRef:
    """One node of the group, and how weaved reaches its node daemon: over TCP at
    ``address:port`` (munge-authenticated: weaved on another host), else at its
    node-local ``socket_path`` (weaved on the node's host: the local backend).

    A node of the group is a node daemon: ``name`` identifies it inside weaved (layout,
    pins, slots, agents, views), ``host`` is the Slurm host it runs on (step nodelists,
    ``NodeAddr``, ready lines, checkpoint directories). They differ for a GPU share,
    whose ``name`` is its daemon's key ``<host>.<Slurm job id>``, so two shares of one
    host are two nodes of one group (daemon/node_daemons.py, "Shares"); None: ``name``."""

    name: str
    pool: Pool
    socket_path: Path
    address: str | None = None
    port: int | None = None
    alloc_id: str | None = None     # the Slurm allocation holding the node (its steps)
    # who starts its daemon: weaved's node-daemon step, whose output is this file on
    # weaved's host (a daemon not answering yet is waited for, not started by hand);
    # None: a daemon weaved does not start (the site's, a test's): 'weave node serve'
    step_log: Path | None = field(default=None, compare=False)
    host: str | None = None         # the Slurm host, where it is not ``name`` (a share)

    @property
    def remote(self) -> bool:
        return self.address is not None

    @property
    def slurm_host(self) -> str:
        """The Slurm host its daemon runs on (``name`` for a whole node)."""
        return self.name if self.host is None else self.host


@dataclass(frozen=True)
class DeclaredProfile:
    """What the job spec declared (seconds per phase); None = unknown."""

    rollout_s: float | None = None
    train_s: float | None = None
    slo: float | None = None


@dataclass(frozen=True)
class MemberSpec:
    """A member job: its RL entry point, seed, options and how many steps to run."""

    job_id: str
    entry_point: str = "builtin:grpo-toy"
    seed: int = 0
    steps: int = 10
    options: Mapping[str, Any] = field(default_factory=dict)
    rollout_pins: tuple[int, ...] = (0,)     # indices into the group's rollout nodes
    # verl's hybrid way: its rollout runs on its own training node (rank 0's), on the
    # same GPUs as its training, never beside it; rollout_pins is () then
    colocated: bool = False
    train_nodes: tuple[int, ...] = (0,)      # indices into the group's training nodes
    # its ranks on train_nodes and engines on rollout_pins, node for node (None: one
    # rank, one engine); the runtime runs every rank (runtime/gang.py), one engine
    layout: MemberLayout | None = None
    # pooled (runtime/pool.py): the group's pool GPUs on each of rollout_pins, in pin
    # order; its engines are derived from it, not from its layout. None: not pooled
    pool: tuple[int, ...] | None = None
    checkpoint_every: int = 1                # train steps between node checkpoints
    declared: DeclaredProfile = field(default_factory=DeclaredProfile)
    staleness: int = 0                       # window k: rollout m uses version max(0, m - k)
    turns: int = 1                           # its steps per round of the cyclic order
    uid: int | None = None                   # owner: workers, shm, checkpoints (None: ours)
    workdir: str | None = None               # the job's own code (docs/job_api.md) ...
    python: str | None = None                # ... None / (): the node's defaults
    pythonpath: tuple[str, ...] = ()
    output: str | None = None                # its --output/--error, absolute: its workers'
    error: str | None = None                 # stdout/stderr (node/job_streams.py)
    container: str | None = None             # an OCI bundle its processes run in
    launch: LaunchPlan | None = None         # a cooperative job: its own processes run
    env: tuple[tuple[str, str], ...] = ()    # its own variables (an array's SLURM_ARRAY_*)
    recoveries: int = 0                      # counted before it joined (a previous weaved)

    @property
    def train_node(self) -> int:
        """Rank 0's training node, the first of ``train_nodes``: where the member's
        batches go and its weights come from (its other ranks: ``runtime/gang.py``).
        A rollout runs as one process on one of its pins at a time; the layout's
        other engines are not started."""
        return self.train_nodes[0]

    def rollout_nodes_in(self, layout: GroupLayout) -> tuple[NodeRef, ...]:
        """The nodes of ``layout`` its rollouts run on: its pins', or, co-located, its
        training node."""
        if self.colocated:
            return (layout.train[self.train_node],)
        return tuple(layout.rollout[p] for p in self.rollout_pins)

    def placed_ranks(self) -> tuple[tuple[int, range], ...]:
        """``(training node index, its global ranks)`` for each of ``train_nodes``."""
        lay = self.layout
        return tuple((n, lay.train.ranks_on(i) if lay is not None else range(1))
                     for i, n in enumerate(self.train_nodes))

    @property
    def rollout_layout(self) -> RolloutLayout | None:
        """Its engines on its pins: a pooled member's from its pool
        (:func:`~weave_slurm.runtime.pool.pool_layout`), else its layout's (None: no
        layout, one engine)."""
        if self.pool is not None:
            return pool_layout(f"member {self.job_id!r}", self.pool, self.engine_gpus)
        return None if self.layout is None else self.layout.rollout

    def placed_engines(self) -> tuple[tuple[int, range], ...]:
        """``(rollout pin, its engine ranks)`` for each of ``rollout_pins``."""
        lay = self.rollout_layout
        return tuple((p, lay.engines_on(i) if lay is not None else range(1))
                     for i, p in enumerate(self.rollout_pins))

    def gpus_on(self, kind: Phase, index: int = 0) -> int:
        """Its GPUs on its ``index``-th node of ``kind``'s pool, as its layout places them
        (training: its ranks there; rollout: its engines there x GPUs per engine)."""
        lay = self.layout
        if lay is None:
            return 1
        if kind is Phase.TRAIN:
            return len(lay.train.ranks_on(index))
        rollout = self.rollout_layout or lay.rollout
        return len(rollout.engines_on(index)) * rollout.engine_gpus

    @property
    def engine_gpus(self) -> int:
        """GPUs per rollout engine (vLLM's ``tensor_parallel_size``)."""
        return 1 if self.layout is None else self.layout.rollout.engine_gpus

    def code(self) -> dict[str, Any]:
        """What ``activate`` carries of the job's own code and output files (only what
        its spec sets)."""
        return {k: v for k, v in (("workdir", self.workdir), ("python", self.python),
                                  ("pythonpath", list(self.pythonpath)),
                                  ("output", self.output), ("error", self.error),
                                  ("container", self.container)) if v}

    def owner_uid(self) -> int:
        """The uid its workers, segments and checkpoints belong to."""
        return os.getuid() if self.uid is None else self.uid

    def phase_args(self, kind: Phase, step: int) -> PhaseArgs:
        """The arguments of this member's rollout of ``step`` or training at version
        ``step`` (a stale member names its ring buffers and, for a rollout, the exact
        weights version it must read)."""
        k = self.staleness
        args = PhaseArgs(self.entry_point, self.seed, dict(self.options), k,
                         engine_gpus=self.engine_gpus, env=self.env)
        if k == 0:
            return args
        traj = buffer_name(TRAJ_BUFFER, step, k)
        if kind is Phase.ROLLOUT:
            version = rollout_version(step, k)
            return replace(args, weights=buffer_name(WEIGHTS_BUFFER, version, k),
                           version=version, traj=traj, step=step)
        return replace(args, traj=traj, step=step)

    def validate(self, rollout_nodes: int, train_nodes: int) -> None:
        where = f"member {self.job_id!r}"
        if self.steps < 1:
            raise ConfigError(f"{where}: steps={self.steps!r}; must be >= 1")
        if self.checkpoint_every < 1:
            raise ConfigError(f"{where}: checkpoint_every={self.checkpoint_every!r}; "
                              "must be >= 1")
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) \
                or not 0 <= self.staleness <= MAX_STALENESS:
            raise ConfigError(f"{where}: staleness={self.staleness!r}; valid: 0..{MAX_STALENESS} "
                              "(0 = strictly on-policy)")
        if isinstance(self.turns, bool) or not isinstance(self.turns, int) \
                or not 1 <= self.turns <= MAX_TURNS:
            raise ConfigError(f"{where}: turns={self.turns!r}; valid: 1..{MAX_TURNS} "
                              "(steps per round of the group's cyclic order)")
        bad = [t for t in self.train_nodes if not 0 <= t < train_nodes]
        if not self.train_nodes or bad or len(set(self.train_nodes)) != len(self.train_nodes):
            raise ConfigError(f"{where}: train_nodes={list(self.train_nodes)!r}; valid: "
                              f"distinct indices in 0..{train_nodes - 1}")
        if not isinstance(self.colocated, bool):
            raise ConfigError(f"{where}: colocated={self.colocated!r}; valid: true, false")
        if self.pool is not None:
            validate_pooled(self, where)
        if self.colocated:
            if self.rollout_pins:
                raise ConfigError(f"{where}: co-located, with rollout_pins="
                                  f"{list(self.rollout_pins)!r}; a co-located member rolls "
                                  "out on its training node: valid: rollout_pins=()")
            if self.launch is not None:
                raise ConfigError(f"{where}: co-located cooperative job: not supported "
                                  "(its own processes hold one node per role); valid: a "
                                  "hosted job, or colocated=false")
            self._validate_layout(where)
            return
        if not self.rollout_pins:
            raise ConfigError(f"{where}: rollout_pins is empty; pin at least one node "
                              "(or colocated=true: its rollout on its training node)")
        if rollout_nodes == 0:
            raise ConfigError(f"{where}: rollout_pins={list(self.rollout_pins)!r}, but the "
                              "group has no rollout nodes; valid: colocated=true")
        bad = [p for p in self.rollout_pins if not 0 <= p < rollout_nodes]
        if bad or len(set(self.rollout_pins)) != len(self.rollout_pins):
            raise ConfigError(f"{where}: rollout_pins={list(self.rollout_pins)!r}; valid: "
                              f"distinct indices in 0..{rollout_nodes - 1}")
        self._validate_layout(where)

    def _validate_layout(self, where: str) -> None:
        lay = self.layout
        if lay is None:
            return
        pins = () if self.colocated or self.pool is not None else \
            (("rollout_pins", len(self.rollout_pins), lay.rollout.nodes),)
        for key, have, want in (("train_nodes", len(self.train_nodes), lay.train.nodes),
                                *pins):
            if have != want:
                raise ConfigError(f"{where}: {key} names {have} node(s) but its layout "
                                  f"({lay.words()}) has {want}; valid: {want} node(s)")


@dataclass(frozen=True)
class GroupLayout:
    """The nodes of a group, by pool, in allocation order. A group of co-located
    members only (``MemberSpec.colocated``) may have no rollout node."""

    rollout: tuple[NodeRef, ...]
    train: tuple[NodeRef, ...]

    def validate(self) -> None:
        if not self.train:
            raise ConfigError("group layout: needs at least one training node (got "
                              f"{len(self.rollout)} rollout and 0 training nodes)")
        for pool, refs in (("rollout", self.rollout), ("train", self.train)):
            names = [n.name for n in refs]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ConfigError(f"group layout: {pool} node(s) {', '.join(twice)} listed "
                                  "twice; each node of a layout is one node daemon (two "
                                  "GPU shares of one host: '<host>.<job id>' each)")
        both = sorted({n.name for n in self.rollout} & {n.name for n in self.train})
        if both:
            raise ConfigError(f"group layout: {', '.join(both)} in both pools; a member "
                              "that rolls out on its training node is co-located "
                              "(MemberSpec.colocated), its node only a training node")
