"""The period of a cyclic phase schedule (pure).

A group's members run one rollout and one training phase each per meta-iteration (a
member with ``turns`` k runs k of each, :func:`slot_order`). Every node serves the
phases of the members pinned to it in a fixed cyclic order; a member's rollout starts
only after its own previous training and its weight sync (the on-policy barrier).
Start times then follow a max-plus linear recurrence, which becomes periodic after a
short transient; the period of that regime is the meta-iteration period, i.e. every
member's steady-state time for its turns.

We run the recurrence and stop as soon as the whole state (every member's last
training end and every node's last busy time) repeats up to a constant shift: from
then on the schedule is exactly periodic, so the period is exact, not an average.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_REL_TOL = 1e-9
#: Most iterations one member may take per meta-iteration (placement's ``turns``).
MAX_TURNS = 16


def cyclic_period(
    rollout_s: Sequence[float],
    train_s: Sequence[float],
    sync_s: Sequence[float],
    rollout_pins: Sequence[Sequence[int]],
    train_pins: Sequence[Sequence[int]],
    rollout_order: Sequence[int] | None = None,
    train_order: Sequence[int] | None = None,
    max_iterations: int = 0,
    closed_form: bool = True,
    staleness: Sequence[int] | None = None,
    turns: Sequence[int] | None = None,
) -> float:
    """Steady-state meta-iteration period of a cyclic schedule.

    Member ``i`` rolls out for ``rollout_s[i]`` on every node in ``rollout_pins[i]``,
    syncs for ``sync_s[i]`` (a delay, no node held), and trains for ``train_s[i]`` on
    every node in ``train_pins[i]``. Each node serves its members in ``rollout_order``
    (rollout nodes) or ``train_order`` (training nodes); both default to the members'
    index order, which is the cyclic round-robin. ``staleness[i] = k`` lets member
    ``i``'s rollout of meta-iteration ``m`` use the weights trained in ``m - 1 - k``
    (0, the default, is the strict on-policy barrier). ``turns[i] = k`` lets
    member ``i`` run ``k`` iterations per meta-iteration (see :func:`slot_order`); given
    at all, the recurrence runs over the slots (callers pass None for one turn each).
    """
    n = len(rollout_s)
    if n == 0:
        return 0.0
    lag = [0] * n if staleness is None else list(staleness)
    if turns is not None:
        if rollout_order is not None or train_order is not None:
            raise ValueError("explicit node orders and turns do not combine")
        # one meta-iteration: each slot's rollout followed by its training
        steps = [(phase, i) for i in slot_order(turns) for phase in (_ROLLOUT, _TRAIN)]
        return _recurrence(rollout_s, train_s, sync_s, rollout_pins, train_pins, lag, steps,
                           max_iterations)
    r_order = range(n) if rollout_order is None else rollout_order
    t_order = range(n) if train_order is None else train_order
    if (closed_form and not any(lag) and _unshared(rollout_pins)
            and _all_share_one_node(train_pins)):
        # Closed form: the training node is the only shared resource, so the period
        # is the larger of its load and the longest single-member cycle.
        return max(sum(train_s), max(r + s + t for r, s, t in zip(rollout_s, sync_s, train_s,
                                                                 strict=True)))
    # one meta-iteration: every rollout in the rollout order, then every training
    steps = [(_ROLLOUT, i) for i in r_order] + [(_TRAIN, i) for i in t_order]
    return _recurrence(rollout_s, train_s, sync_s, rollout_pins, train_pins, lag, steps,
                       max_iterations)


_ROLLOUT, _TRAIN = 0, 1


def _recurrence(rollout_s: Sequence[float], train_s: Sequence[float],
                sync_s: Sequence[float], rollout_pins: Sequence[Sequence[int]],
                train_pins: Sequence[Sequence[int]], lag: list[int],
                steps: Sequence[tuple[int, int]], max_iterations: int) -> float:
    """Run the max-plus recurrence, one meta-iteration = ``steps`` (phase, member) in
    order, until the state repeats up to a shift; the period is that shift."""
    n = len(rollout_s)
    r_free = [0.0] * (1 + max((p for pins in rollout_pins for p in pins), default=-1))
    t_free = [0.0] * (1 + max((p for pins in train_pins for p in pins), default=-1))
    # ends[i][j]: end of member i's training j+1 meta-iterations ago (ready at time 0).
    ends = [[-s] * (k + 1) for s, k in zip(sync_s, lag, strict=True)]
    r_end = [0.0] * n
    history: list[list[float]] = []
    m = len(steps) // 2   # phases of each kind per meta-iteration
    scale = max(1.0, sum(rollout_s) + sum(train_s) + sum(sync_s)) * m / n
    tol = _REL_TOL * scale
    limit = max_iterations or (12 * m + 24) * (1 + max(lag))
    for k in range(limit):
        for phase, i in steps:
            if phase == _ROLLOUT:
                start = ends[i][-1] + sync_s[i]
                for node in rollout_pins[i]:
                    if r_free[node] > start:
                        start = r_free[node]
                end = start + rollout_s[i]
                for node in rollout_pins[i]:
                    r_free[node] = end
                r_end[i] = end
            else:
                start = r_end[i]
                for node in train_pins[i]:
                    if t_free[node] > start:
                        start = t_free[node]
                end = start + train_s[i]
                for node in train_pins[i]:
                    t_free[node] = end
                ends[i] = [end, *ends[i][:-1]]
        state = [e for hist in ends for e in hist] + r_free + t_free
        for back in range(1, min(k, (2 * m + 4) * (1 + max(lag))) + 1):
            prev = history[k - back]
            shift = state[0] - prev[0]
            if all(abs((a - b) - shift) <= tol for a, b in zip(state, prev, strict=True)):
                return shift / back
        history.append(state)
    # No exact repetition within the limit (ill-conditioned durations): use the
    # average growth over the second half, which converges to the same period.
    half = len(history) // 2
    return max((a - b) for a, b in zip(history[-1], history[half - 1], strict=True)) / (
        len(history) - half)


def slot_order(turns: Sequence[int]) -> tuple[int, ...]:
    """The cyclic order of the phases of one meta-iteration when member ``i`` runs
    ``turns[i]`` iterations in it: member ``i``'s ``c``-th iteration sits at
    ``(c + 1/2) / k_i`` of the cycle (spread evenly), ties in member order. With every
    turn count 1 this is the members' order."""
    keys = [((c + 0.5) / k, i) for i, k in enumerate(turns) for c in range(k)]
    return tuple(i for _, i in sorted(keys))


def _unshared(pins: Sequence[Sequence[int]]) -> bool:
    seen: set[int] = set()
    for member in pins:
        for node in member:
            if node in seen:
                return False
            seen.add(node)
    return True


def _all_share_one_node(pins: Sequence[Sequence[int]]) -> bool:
    if not pins:
        return True
    common = set(pins[0])
    for member in pins[1:]:
        common &= set(member)
    return bool(common)



@dataclass(frozen=True, slots=True)
class PhaseRun:
    """One phase of one member in an unrolled cyclic schedule."""

    member: int
    meta_iteration: int
    phase: str  # "rollout" or "train"
    start_s: float
    end_s: float
    nodes: tuple[int, ...]
    weights_version: int  # rollout: weights it used; train: the version it produces


def cyclic_timeline(
    rollout_s: Sequence[float],
    train_s: Sequence[float],
    sync_s: Sequence[float],
    rollout_pins: Sequence[Sequence[int]],
    train_pins: Sequence[Sequence[int]],
    meta_iterations: int,
    staleness: Sequence[int] | None = None,
) -> list[PhaseRun]:
    """The explicit schedule of ``meta_iterations`` rounds (round-robin order).

    Weight versions count training steps: a member starts at version 0, training in
    meta-iteration ``m`` produces version ``m + 1``, and a rollout in ``m`` uses the
    newest version its window allows, ``max(0, m - k)``. Used for Gantt charts and to
    check the dependency windows and node exclusivity of a schedule.
    """
    n = len(rollout_s)
    lag = [0] * n if staleness is None else list(staleness)
    r_free: dict[int, float] = {}
    t_free: dict[int, float] = {}
    ends = [[-s] * (k + 1) for s, k in zip(sync_s, lag, strict=True)]
    out: list[PhaseRun] = []
    for m in range(meta_iterations):
        r_end = [0.0] * n
        for i in range(n):
            start = max([ends[i][-1] + sync_s[i]] + [r_free.get(p, 0.0) for p in rollout_pins[i]])
            r_end[i] = start + rollout_s[i]
            for p in rollout_pins[i]:
                r_free[p] = r_end[i]
            out.append(PhaseRun(i, m, "rollout", start, r_end[i], tuple(rollout_pins[i]),
                                max(0, m - lag[i])))
        for i in range(n):
            start = max([r_end[i]] + [t_free.get(p, 0.0) for p in train_pins[i]])
            end = start + train_s[i]
            for p in train_pins[i]:
                t_free[p] = end
            ends[i] = [end, *ends[i][:-1]]
            out.append(PhaseRun(i, m, "train", start, end, tuple(train_pins[i]), m + 1))
    return out
