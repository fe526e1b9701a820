"""Admitting a batch of arrivals: the order in which one scheduling tick places them.

Jobs that arrive together (one reconcile tick of the daemon, a ``weave plan`` run, a
set in the optimality benchmark) are placed one by one, but the order matters to a
greedy placer. Like first-fit-decreasing in bin packing, we try a small portfolio of
orders - tightest SLO budget first (a job with little slack has few groups it can
join), longest solo iteration first, least training slack first - plus the arrival
order, and keep the cheapest outcome (fewest refusals first, then cost, then the
portfolio's order). On random 6-8-job sets this takes the greedy from ~1.05-1.08x of
the exact optimum to ~1.01x (bench/placement.py --optimality). Single arrivals are
placed as they come.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.batch_search import decisions_in, improve_batch
from weave_slurm.placement.cluster_state import ClusterState, apply
from weave_slurm.placement.decision import Decision, Placement, Refusal
from weave_slurm.placement.engine import WeavePolicy
from weave_slurm.placement.policy import Policy

Ordering = Callable[[JobProfile], tuple[float, str]]

#: The portfolio, in tie-break order. ``None`` stands for the arrival order.
ORDERINGS: tuple[Ordering | None, ...] = (
    lambda j: (j.budget_s, j.job_id),
    lambda j: (-j.solo_s, j.job_id),
    lambda j: (j.budget_s - j.train_max_s, j.job_id),
    None,
)


@dataclass(frozen=True, slots=True)
class BatchResult:
    state: ClusterState
    decisions: tuple[Decision, ...]  # in the order the jobs were given


def _place(policy: Policy, state: ClusterState,
           order: Sequence[JobProfile]) -> tuple[ClusterState, dict[str, Decision]]:
    decisions: dict[str, Decision] = {}
    for job in order:
        decision = policy.place(state, job)
        if isinstance(decision, Placement):
            state = apply(state, decision)
        decisions[job.job_id] = decision
    return state, decisions


def together(policy: Policy) -> Policy:
    """The policy for jobs placed together: weave's lets joins take turns
    (:meth:`~weave_slurm.placement.engine.WeavePolicy.together`); others as they are."""
    return policy.together() if isinstance(policy, WeavePolicy) else policy


def batch_outcomes(policy: Policy, state: ClusterState, jobs: Sequence[JobProfile],
                   ordered: bool = True) -> list[BatchResult]:
    """One outcome per order of the portfolio (only the arrival order if not ``ordered``),
    in the portfolio's order; decisions in the order of ``jobs``."""
    orderings = ORDERINGS if ordered and len(jobs) > 1 else (None,)
    if len(jobs) > 1:
        policy = together(policy)
    out = []
    for key in orderings:
        order = list(jobs) if key is None else sorted(jobs, key=key)
        final, decisions = _place(policy, state, order)
        out.append(BatchResult(final, tuple(decisions[j.job_id] for j in jobs)))
    return out


def place_batch(policy: Policy, state: ClusterState, jobs: Sequence[JobProfile],
                ordered: bool = True) -> BatchResult:
    """Place a batch with the cheapest order of the portfolio (or as given if not ``ordered``).

    Decisions come back in the order of ``jobs`` whatever order placed them.
    """
    outcomes = batch_outcomes(policy, state, jobs, ordered)
    best = min(enumerate(outcomes), key=lambda ro: (refusals(ro[1]),
                                                    round(ro[1].state.cost_per_hour, 9),
                                                    ro[0]))[1]
    if len(jobs) < 2 or not isinstance(policy, WeavePolicy):
        return best
    final = improve_batch(state, best.state)   # local search over the batch's groups
    if final is best.state:
        return best
    return BatchResult(final, decisions_in(final, best.state, best.decisions,
                                           [j.job_id for j in jobs]))


def refusals(result: BatchResult) -> int:
    return sum(isinstance(d, Refusal) for d in result.decisions)
