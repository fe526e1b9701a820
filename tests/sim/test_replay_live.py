"""``weave-live``: the simulator's re-planning restricted as weaved takes it (every move
onto nodes the group already holds; docs/daemon.md "Re-planning running jobs")."""

from __future__ import annotations

import pytest

from weave_slurm.placement.cluster import Capacity, ClusterState
from weave_slurm.placement.replan import Replan, needs_nodes
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.policies import Accounting, SimPolicy
from weave_slurm.sim.replay import Replay, ReplayOptions


def _proposals(policy: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], bool]]:
    """Each re-plan the replay of ``policy`` was offered: (the groups it needs nodes
    for, whether it was taken)."""
    seen: list[tuple[list[int], bool]] = []
    take = Replay._take

    def spy(self: Replay, plan: Replan | None) -> None:
        before: ClusterState = self.state
        take(self, plan)
        if plan is not None:
            seen.append((needs_nodes(before, plan.state), self.state is not before))

    monkeypatch.setattr(Replay, "_take", spy)
    trace = generate_trace(GeneratorConfig(n_jobs=80, seed=7))
    Replay(trace, Capacity.from_site(reference_site(), 5), SimPolicy.make(policy),
           ReplayOptions(accounting=Accounting.CONSISTENT)).run()
    return seen


def test_weave_live_takes_only_moves_onto_held_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    full = _proposals("weave", monkeypatch)
    assert any(grows and taken for grows, taken in full)   # weave does take such moves
    live = _proposals("weave-live", monkeypatch)
    assert any(taken for _, taken in live)                 # and weave-live takes others
    assert not any(grows and taken for grows, taken in live)
    assert any(grows for grows, _ in live)                 # it was offered some and left them
