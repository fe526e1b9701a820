"""What ran where and when: the record behind busy fractions, overheads and Gantt charts."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from weave_slurm.vocab import Phase, Pool


@dataclass(frozen=True)
class Span:
    """One phase of one member on one node, in the runner's clock (seconds)."""

    job_id: str
    kind: Phase
    node: str
    pool: Pool
    start_s: float
    end_s: float
    ok: bool = True
    ready_s: float | None = None          # when the member was ready for this phase
    worker_start_s: float | None = None   # the entry received the activation (worker)
    worker_end_s: float | None = None     # the entry returned (worker)
    init: bool = False                    # a member's first phase: it builds its model

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_json(self) -> dict[str, object]:
        return {"job": self.job_id, "phase": self.kind.value, "node": self.node,
                "pool": self.pool.value, "start_s": self.start_s, "end_s": self.end_s,
                "ok": self.ok, "ready_s": self.ready_s, "worker_start_s": self.worker_start_s,
                "worker_end_s": self.worker_end_s, "init": self.init}


def _union_s(intervals: Iterable[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def busy_fraction(spans: Sequence[Span], pool: Pool, nodes: Sequence[str],
                  start_s: float, end_s: float) -> float:
    """Busy node-seconds of a pool over ``nodes x (end - start)``.

    Rollout and train phases count; sync counts on the pool of the node it ran on.
    """
    wall = end_s - start_s
    if wall <= 0 or not nodes:
        return 0.0
    busy = sum(_union_s((s.start_s, s.end_s) for s in spans
                        if s.pool is pool and s.node == node) for node in nodes)
    return busy / (wall * len(nodes))


def switch_gaps_s(spans: Sequence[Span], kind: Phase) -> list[float]:
    """Meta-iteration overhead: on each node, one member's ``kind`` phase ending (its
    entry returned, worker clock) to the next member's entry starting.

    Only back-to-back pairs of *different* members count (that is the switch), and only
    where the second member was ready before the first phase ended (it was waiting for
    the node, so the gap is pure runtime overhead, not an empty pool). Workers and the
    runner share the host's CLOCK_MONOTONIC.
    """
    gaps: list[float] = []
    by_node: dict[str, list[Span]] = {}
    for s in spans:
        if s.kind is kind and s.ok and s.worker_start_s is not None \
                and s.worker_end_s is not None:
            by_node.setdefault(s.node, []).append(s)
    for node_spans in by_node.values():
        node_spans.sort(key=lambda s: s.start_s)
        gaps += [g for a, b in itertools.pairwise(node_spans)
                 if (g := switch_gap_s(a, b)) is not None]
    return gaps


def switch_gap_s(a: Span, b: Span) -> float | None:
    """The switch from ``a`` to ``b``, the next phase on the same node (see
    :func:`switch_gaps_s`); None where the pair is no switch."""
    if a.job_id == b.job_id or b.ready_s is None or a.worker_end_s is None \
            or b.worker_start_s is None or b.ready_s > a.worker_end_s:
        return None
    return b.worker_start_s - a.worker_end_s


class TimelineObserver(Protocol):
    """Told what the runtime records as it happens (weaved's metrics): each rollout or
    train phase that ended, and each copy of a segment (``what``: weights or
    trajectories, the bytes put on nodes; ``span``: its sync span)."""

    def phase_ended(self, span: Span) -> None: ...

    def synced(self, span: Span, what: str, nbytes: int) -> None: ...


class NoObserver:
    """The observer of a runtime nobody watches."""

    def phase_ended(self, span: Span) -> None:
        return None

    def synced(self, span: Span, what: str, nbytes: int) -> None:
        return None


_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def gantt_png(spans: Sequence[Span], path: Path, title: str) -> Path:
    """A Gantt chart: one row per node, one colour per member, hatched = train, grey =
    a member's first phase (its model build, not training); the legend right of the
    plot, where it hides no bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    nodes = sorted({(s.pool.value, s.node) for s in spans}, reverse=True)
    rows = {node: i for i, (_, node) in enumerate(nodes)}
    jobs = sorted({s.job_id for s in spans})
    color = {job: _COLORS[i % len(_COLORS)] for i, job in enumerate(jobs)}
    t0 = min((s.start_s for s in spans), default=0.0)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.6 * max(1, len(nodes))))
    for s in spans:
        hatch = "" if s.init else {Phase.TRAIN: "//", Phase.SYNC: ".."}.get(s.kind, "")
        face = "black" if not s.ok else ("lightgrey" if s.init else color[s.job_id])
        ax.broken_barh([(s.start_s - t0, max(s.duration_s, 1e-4))], (rows[s.node] - 0.4, 0.8),
                       facecolors=face, hatch=hatch, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(nodes)), [f"{node} ({pool})" for pool, node in nodes])
    ax.set_xlabel("time since start (s)")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=color[j], label=j) for j in jobs]
              + [Patch(facecolor="white", edgecolor="grey", hatch="//", label="train"),
                 Patch(facecolor="white", edgecolor="grey", hatch="..", label="weight sync"),
                 Patch(facecolor="lightgrey", label="model build (first phase)"),
                 Patch(facecolor="black", label="failed")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
