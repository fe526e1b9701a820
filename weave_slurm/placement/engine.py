"""Inter-group placement: where an arriving job goes (pure).

``WeavePolicy.place(state, job)`` considers, in the paper's terms, *direct packing*
into an existing group's idle slots, *rollout scaling* (the job joins a group whose
training side has room, on new h20 nodes) and *isolated provisioning* (a new group).
Every candidate keeps every member within its SLO and every node within its host
memory under the admission bound (every rollout at max tokens). The cheapest
candidate wins; ties go to the tightest fit (best-fit), then to the lowest group id,
so the decision is deterministic.

Saturated groups are pruned by O(1) necessary conditions before any schedule is
computed: the shared training node serialises training, so a group whose training
load plus the newcomer's exceeds the tightest budget cannot take it, whatever the
order. This keeps a decision close to linear in the number of active groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.colocation import (
    beats_grouping,
    cheaper_per_work,
    colocation_placement,
    join_colocated,
    may_join_colocated,
)
from weave_slurm.placement.decision import Admission, Decision, Placement
from weave_slurm.placement.fit import (
    capacity_refusal,
    may_fit,
    new_group_placement,
    refuse_if_never_fits,
    turn_options,
)
from weave_slurm.placement.group import Group, Member, period_floor_s
from weave_slurm.placement.pooled import widens
from weave_slurm.placement.pooled_placement import place_pooled
from weave_slurm.placement.repack import best_group, turn_sets

_EPS = 1e-9
#: Largest group (after the arrival) that placement may re-pin from scratch.
REPACK_MAX_MEMBERS = 4


def group_placements(state: ClusterState, job: JobProfile,
                     repack: bool = False) -> Iterator[Placement]:
    """Every feasible way to add ``job`` to an existing group (direct or scaled).

    With ``repack``, a small group may also be re-pinned from scratch around the
    newcomer when that needs fewer rollout nodes than keeping the current pins.
    """
    cap = state.capacity
    free_r = cap.rollout_pool_nodes - state.rollout_nodes_used
    free_t = cap.train_pool_nodes - state.train_nodes_used
    for group in state.open_groups():
        if not may_fit(group, job, cap, free_t):
            continue
        fewest = None
        for cand in _placements_in(group, job, cap, free_r):
            added = round(cand.added_rollout_nodes)   # whole nodes here
            fewest = added if fewest is None else min(fewest, added)
            yield cand
        if repack and group.size < REPACK_MAX_MEMBERS and fewest != 0:
            # Only worth it if re-pinning needs fewer new nodes than the best so far.
            max_added = job.rollout_nodes if fewest is None else fewest - 1
            repacked = _repacked(group, job, cap, free_r, max_added)
            if repacked is not None:
                yield repacked


def _repacked(group: Group, job: JobProfile, cap: Capacity, free_r: float,
              max_added: int, turns: bool = False) -> Placement | None:
    """``group`` re-pinned from scratch around ``job`` on at most ``max_added`` new nodes
    (``turns``: members may take several)."""
    limit = min(group.rollout_nodes + max_added, group.rollout_nodes + math.floor(free_r),
                cap.max_rollout_nodes_per_group)
    jobs = [m.job for m in group.members] + [job]
    g = best_group(jobs, cap, group.group_id, max_rollout_nodes=limit, turns=turns,
                   pooled=False)
    if g is None:
        return None
    added_r = g.rollout_nodes - group.rollout_nodes
    added_t = max(0, g.train_nodes - group.train_nodes)
    kind = Admission.DIRECT if added_r <= 0 else Admission.SCALE_ROLLOUT
    return Placement(job.job_id, kind, g, cap.rates.rate(added_r, added_t), added_r, added_t)


def _placements_in(group: Group, job: JobProfile, cap: Capacity,
                   free_r: float) -> Iterator[Placement]:
    m = job.rollout_nodes
    added_t = max(0, job.train_nodes - group.train_nodes)
    t_cost = cap.rates.rate(0, added_t)
    if m <= group.rollout_nodes:
        for pins in _direct_pins(group, job, cap):
            placed = _with_member(group, job, pins, group.rollout_nodes, cap)
            if placed is not None:
                yield Placement(job.job_id, Admission.DIRECT, placed, t_cost, 0, added_t)
    if m <= free_r and group.rollout_nodes + m <= cap.max_rollout_nodes_per_group:
        pins = tuple(range(group.rollout_nodes, group.rollout_nodes + m))
        placed = _with_member(group, job, pins, group.rollout_nodes + m, cap)
        if placed is not None:
            yield Placement(job.job_id, Admission.SCALE_ROLLOUT, placed,
                            t_cost + cap.rates.rate(m, 0), m, added_t)


def _direct_pins(group: Group, job: JobProfile, cap: Capacity) -> Iterator[tuple[int, ...]]:
    """Existing rollout nodes the job could share, filtered by load and memory."""
    load, mem, nb = group.rollout_load_s, group.rollout_mem_used_gib, group.node_min_budget_s
    ok = [n for n in range(group.rollout_nodes)
          if load[n] + job.rollout_max_s <= min(nb[n], job.budget_s) + _EPS
          and mem[n] + job.rollout_state_gib <= cap.rollout_mem_gib + _EPS]
    if job.rollout_gpu_peak_gib and cap.rollout_gpu_mem_gib < math.inf:
        ok = [n for n in ok if _gpu_fits(group, job, n, cap.rollout_gpu_mem_gib)]
    if job.rollout_nodes == 1:
        for n in ok:
            yield (n,)
    elif len(ok) >= job.rollout_nodes:
        yield tuple(sorted(sorted(ok, key=lambda n: (load[n], n))[: job.rollout_nodes]))


def _gpu_fits(group: Group, job: JobProfile, node: int, gpu_mem_gib: float) -> bool:
    """Whether rollout node ``node``'s GPUs still fit with ``job`` pinned there too."""
    held = job.rollout_gpu_resident_gib
    extra = job.rollout_gpu_peak_gib - held
    for m in group.members:
        if node in m.rollout_pins:
            j = m.job
            held += j.rollout_gpu_resident_gib
            extra = max(extra, j.rollout_gpu_peak_gib - j.rollout_gpu_resident_gib)
    return held + extra <= gpu_mem_gib + _EPS


def _with_member(group: Group, job: JobProfile, pins: tuple[int, ...], rollout_nodes: int,
                 cap: Capacity, turns: int = 1) -> Group | None:
    """The group with ``job`` (taking ``turns``) added at the first cyclic position that
    keeps it feasible."""
    member = Member(job, pins, turns)
    train_nodes = max(group.train_nodes, job.train_nodes)
    shared = any(p < group.rollout_nodes for p in pins)
    positions = range(group.size, -1, -1) if shared else (group.size,)
    for pos in positions:
        members = (*group.members[:pos], member, *group.members[pos:])
        trial = Group(group.group_id, members, rollout_nodes, train_nodes)
        if cap.fits(trial):
            return trial
    return None


def _lower_bound_period(group: Group, job: JobProfile, shared_load_s: float,
                        turns: int = 1) -> float:
    """A cheap lower bound on the period after adding ``job`` taking ``turns`` (adding
    never shortens it)."""
    return max(group.schedule.period_s, group.train_load_s + turns * job.train_max_s,
               turns * job.solo_s, shared_load_s)


def _repinned_slack_bound(jobs: tuple[JobProfile, ...], turns: tuple[int, ...],
                          rollout_nodes: int) -> float:
    """An upper bound on the tightest slack of ``jobs`` re-pinned from scratch with these
    turns on ``rollout_nodes``: the period is at least the training load, every member's
    own turns and the rollout work spread over the nodes."""
    pairs = tuple(zip(turns, jobs, strict=True))
    bound = max(period_floor_s(jobs, turns),
                sum(k * j.rollout_max_s * j.rollout_nodes for k, j in pairs) / rollout_nodes)
    return _slack(min(k * j.budget_s for k, j in pairs), bound)


def _slack(budget_s: float, period_s: float) -> float:
    """Relative slack of the tightest member: 1 - period / smallest budget."""
    return 1.0 - period_s / budget_s


class WeavePolicy:
    """Cheapest feasible option; among equals, the one that leaves the most slack.

    Tiers, cheapest first: direct packing (on current pins, or after re-pinning a
    small group's members around the newcomer without new nodes), rollout scaling, a
    new group. Inside a tier the winner is
    the candidate whose tightest member keeps the most relative slack (worst fit): it
    damages the existing members' SLO headroom least and leaves room for later
    arrivals and for rollouts longer than planned. A cheap lower bound on the new
    period gives an upper bound on each candidate's slack, so candidates are examined
    in that order and the search stops (branch and bound) once no remaining bound can
    beat the best exact slack found; the exact cyclic schedule is computed only for
    the candidates examined.

    With ``join_turns`` a newcomer may also join taking several turns per meta-iteration
    (:func:`turn_options`) and a re-pinned group may give its members turns:
    :meth:`together` is the policy for jobs placed together (a batch, a re-placement, a
    re-plan), where the order portfolio sees the set; a lone arrival takes one turn
    (docs/placement.md, "Turns").
    """

    name = "weave"

    def __init__(self, repack: bool = True, join_turns: bool = False) -> None:
        self.repack = repack
        self.join_turns = join_turns

    def together(self) -> WeavePolicy:
        """The policy for jobs placed together: joins may take turns."""
        return self if self.join_turns else WeavePolicy(self.repack, join_turns=True)

    def place(self, state: ClusterState, job: JobProfile) -> Decision:
        cap = state.capacity
        colo = colocation_placement(state, job) if cap.colocation else None
        never = refuse_if_never_fits(job, cap)
        if never is not None:
            return never if colo is None else colo
        fresh: Placement | None = None
        if cap.rollout_pooled and widens(job):   # pools pay only through width
            pooled = place_pooled(state, job, self.join_turns)
            found = pooled if isinstance(pooled, Placement) else None
        else:
            found, fresh = self._pinned_options(state, job)
        if colo is None:
            best = found or fresh
            return best if best is not None else capacity_refusal(state, job)
        if found is not None and not beats_grouping(colo, cap):
            return found   # groups of jobs like it could beat co-location: join
        # the option that leaves the cluster cheapest per unit of work
        return cheaper_per_work(state, [p for p in (found, fresh, colo) if p is not None])

    def _pinned_options(self, state: ClusterState, job: JobProfile
                        ) -> tuple[Placement | None, Placement | None]:
        """The tiers above over the node-pinned groups (and, with co-location, joining
        a co-located job as rollout scaling: placement/colocation.py): the first
        tier's winner, and a new group where there is none or co-location is on."""
        cap = state.capacity
        free_r = cap.rollout_pool_nodes - state.rollout_nodes_used
        free_t = cap.train_pool_nodes - state.train_nodes_used
        groups: list[Group] = []
        turning: list[Group] = []   # groups only a newcomer taking turns may join
        pinned, joinable = _pinned_groups(state)
        # co-located jobs it may join, disaggregating them
        colocated = [g for g in joinable if may_join_colocated(g, job, cap, free_t,
                                                               self.join_turns)]
        for g in pinned:
            if may_fit(g, job, cap, free_t):
                groups.append(g)
            elif self.join_turns and may_fit(g, job, cap, free_t, True):
                turning.append(g)
        tiers = ((self._direct, self._repack), (self._scale, self._repack_scaled))
        for k, tier in enumerate(tiers):
            cands = [c for make in tier for c in make(groups, job, cap, free_r)]
            if k and turning:   # rollout scaling, taking turns (one turn cannot fit)
                cands += self._scale(turning, job, cap, free_r, several=True)
            if k and colocated:
                cands += self._join_colocated(colocated, job, cap, free_r, free_t)
            found = _most_slack(cands)
            if found is not None:
                return found, new_group_placement(state, job) if cap.colocation else None
        return None, new_group_placement(state, job)

    @staticmethod
    def _direct(groups: list[Group], job: JobProfile, cap: Capacity,
                free_r: float) -> list[_Candidate]:
        out = []
        for g in groups:
            if job.rollout_nodes > g.rollout_nodes:
                continue
            load = g.rollout_load_s
            added_t = max(0, job.train_nodes - g.train_nodes)
            # one turn: a member taking turns has its rollout nodes to itself
            # (Group.turns_apart), and every node of a group has a member already
            for pins in _direct_pins(g, job, cap):
                shared = max(load[p] for p in pins) + job.rollout_max_s
                bound = _lower_bound_period(g, job, shared)

                def build(g: Group = g, pins: tuple[int, ...] = pins,
                          added_t: int = added_t) -> Placement | None:
                    placed = _with_member(g, job, pins, g.rollout_nodes, cap)
                    if placed is None:
                        return None
                    return Placement(job.job_id, Admission.DIRECT, placed,
                                     cap.rates.rate(0, added_t), 0, added_t)

                out.append(_Candidate(_slack(min(g.min_budget_s, job.budget_s), bound),
                                      g.group_id, pins, build))
        return out

    def _repack(self, groups: list[Group], job: JobProfile, cap: Capacity,
                free_r: float, added: int = 0) -> list[_Candidate]:
        """Re-pin a small group from scratch around the newcomer on at most
        ``added`` new rollout nodes."""
        if not self.repack or added > free_r:
            return []
        out = []
        for g in groups:
            if g.size >= REPACK_MAX_MEMBERS:
                continue
            if g.rollout_nodes + added > cap.max_rollout_nodes_per_group:
                continue
            # Re-pinning may shorten the current period, so the bound omits it; the
            # rollout work must still fit on the nodes the re-pinned group may use.
            # (with any of the turns re-pinning may give them)
            jobs = (*(m.job for m in g.members), job)
            sets = turn_sets(jobs) if self.join_turns else ((1,) * len(jobs),)
            slack = max(_repinned_slack_bound(jobs, turns, g.rollout_nodes + added)
                        for turns in sets)

            def build(g: Group = g) -> Placement | None:
                return _repacked(g, job, cap, free_r, added, self.join_turns)

            out.append(_Candidate(slack, g.group_id, (), build, expensive=True))
        return out

    def _join_colocated(self, groups: list[Group], job: JobProfile, cap: Capacity,
                        free_r: float, free_t: int) -> list[_Candidate]:
        """Rollout scaling of co-located groups: ``job`` beside each one's job, both
        disaggregated on new rollout nodes (re-pinning searches, so examined last)."""
        out = []
        for g in groups:
            jobs = (g.members[0].job, job)
            sets = turn_sets(jobs) if self.join_turns else ((1, 1),)
            nodes = sum(j.rollout_nodes for j in jobs)
            slack = max(_repinned_slack_bound(jobs, turns, nodes) for turns in sets)

            def build(g: Group = g) -> Placement | None:
                return join_colocated(g, job, cap, free_r, free_t, self.join_turns)

            out.append(_Candidate(slack, g.group_id, (), build, expensive=True))
        return out

    def _repack_scaled(self, groups: list[Group], job: JobProfile, cap: Capacity,
                       free_r: float) -> list[_Candidate]:
        return self._repack(groups, job, cap, free_r, added=job.rollout_nodes)

    def _scale(self, groups: list[Group], job: JobProfile, cap: Capacity,
               free_r: float, several: bool = False) -> list[_Candidate]:
        """Rollout scaling into each group (``several``: only taking several turns)."""
        m = job.rollout_nodes
        if m > free_r:
            return []
        out = []
        for g in groups:
            if g.rollout_nodes + m > cap.max_rollout_nodes_per_group:
                continue
            options = turn_options(g, job, self.join_turns)
            for turns in (k for k in options if k > 1 or not several):
                bound = _lower_bound_period(g, job, 0.0, turns)

                def build(g: Group = g, turns: int = turns) -> Placement | None:
                    pins = tuple(range(g.rollout_nodes, g.rollout_nodes + m))
                    placed = _with_member(g, job, pins, g.rollout_nodes + m, cap, turns)
                    if placed is None:
                        return None
                    added_t = max(0, job.train_nodes - g.train_nodes)
                    return Placement(job.job_id, Admission.SCALE_ROLLOUT, placed,
                                     cap.rates.rate(m, added_t), m, added_t)

                out.append(_Candidate(_slack(min(g.min_budget_s, turns * job.budget_s),
                                             bound), g.group_id, (turns,), build))
        return out


def _pinned_groups(state: ClusterState) -> tuple[tuple[Group, ...], tuple[Group, ...]]:
    """The open node-pinned groups of ``state``, and its open co-located groups a
    newcomer may join (``colocation.may_join_colocated``'s per-group part); worked out
    once per state (``ClusterState.once``)."""
    def split() -> tuple[tuple[Group, ...], tuple[Group, ...]]:
        cap = state.capacity
        opened = state.open_groups()
        return (tuple(g for g in opened if not g.pooled and not g.colocated),
                tuple(g for g in opened if g.colocated and cap.colocation
                      and may_join_colocated(g, None, cap, 0)))
    return state.once("pinned_groups", split)


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A candidate placement not yet checked: an upper bound on its slack and a builder."""

    slack_bound: float
    group_id: int
    pins: tuple[int, ...]
    build: Callable[[], Placement | None]
    expensive: bool = False  # a re-pinning search rather than one schedule


def _most_slack(candidates: list[_Candidate]) -> Placement | None:
    """The feasible candidate with the most exact slack (ties: lowest group id, pins).

    Cheap candidates (one schedule each) are examined first so that their best exact
    slack prunes the expensive re-pinning searches; within each kind, in order of
    their slack bound, stopping once no remaining bound can beat the incumbent.
    """
    candidates.sort(key=lambda c: (c.expensive, -c.slack_bound, c.group_id, c.pins))
    best: Placement | None = None
    best_key = (float("inf"), float("inf"))
    for cand in candidates:
        if cand.slack_bound < -best_key[1] - _EPS:
            if cand.expensive:
                break  # sorted by bound within the expensive kind too
            continue  # the rest of the cheap kind cannot win; go on to the expensive
        placed = cand.build()
        if placed is None:
            continue
        slack = _slack(placed.group.min_budget_s, placed.group.schedule.period_s)
        key = (round(placed.cost_delta_per_hour, 9), -slack)
        if key[0] < best_key[0] - _EPS or (abs(key[0] - best_key[0]) <= _EPS
                                            and key[1] < best_key[1] - _EPS):
            best, best_key = placed, key
    return best
