"""The period of a cyclic phase schedule (pure).

A group's members run one rollout and one training phase each per meta-iteration.
Every node serves the phases of the members pinned to it in a fixed cyclic order; a
member's rollout of meta-iteration k starts only after its own training of k-1 and
its weight sync (the on-policy barrier). Start times then follow a max-plus linear
recurrence, which becomes periodic after a short transient; the period of that
regime is the meta-iteration period, i.e. every member's steady-state iteration time.

We run the recurrence and stop as soon as the whole state (every member's last
training end and every node's last busy time) repeats up to a constant shift: from
then on the schedule is exactly periodic, so the period is exact, not an average.
"""

from __future__ import annotations

from collections.abc import Sequence

_REL_TOL = 1e-9


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
) -> float:
    """Steady-state meta-iteration period of a cyclic schedule.

    Member ``i`` rolls out for ``rollout_s[i]`` on every node in ``rollout_pins[i]``,
    syncs for ``sync_s[i]`` (a delay, no node held), and trains for ``train_s[i]`` on
    every node in ``train_pins[i]``. Each node serves its members in ``rollout_order``
    (rollout nodes) or ``train_order`` (training nodes); both default to the members'
    index order, which is the cyclic round-robin.
    """
    n = len(rollout_s)
    if n == 0:
        return 0.0
    r_order = range(n) if rollout_order is None else rollout_order
    t_order = range(n) if train_order is None else train_order
    if closed_form and _unshared(rollout_pins) and _all_share_one_node(train_pins):
        # Closed form: the training node is the only shared resource, so the period
        # is the larger of its load and the longest single-member cycle.
        return max(sum(train_s), max(r + s + t for r, s, t in zip(rollout_s, sync_s, train_s,
                                                                 strict=True)))
    r_nodes = 1 + max((p for pins in rollout_pins for p in pins), default=-1)
    t_nodes = 1 + max((p for pins in train_pins for p in pins), default=-1)
    r_free = [0.0] * r_nodes
    t_free = [0.0] * t_nodes
    t_end = [-s for s in sync_s]
    r_end = [0.0] * n
    history: list[list[float]] = []
    scale = max(1.0, sum(rollout_s) + sum(train_s) + sum(sync_s))
    tol = _REL_TOL * scale
    limit = max_iterations or (12 * n + 24)
    for k in range(limit):
        for i in r_order:
            start = t_end[i] + sync_s[i]
            for node in rollout_pins[i]:
                if r_free[node] > start:
                    start = r_free[node]
            end = start + rollout_s[i]
            for node in rollout_pins[i]:
                r_free[node] = end
            r_end[i] = end
        for i in t_order:
            start = r_end[i]
            for node in train_pins[i]:
                if t_free[node] > start:
                    start = t_free[node]
            end = start + train_s[i]
            for node in train_pins[i]:
                t_free[node] = end
            t_end[i] = end
        state = t_end + r_free + t_free
        for back in range(1, min(k, 2 * n + 4) + 1):
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
