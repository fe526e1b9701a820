"""``weave-live``: the simulator's re-planning restricted as weaved takes it (moves onto
nodes the new group holds, or waiting for nodes where the old group only loses its
moving jobs; docs/daemon.md "Moves that wait for nodes")."""

from __future__ import annotations

import pytest

from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.replan import Replan, needs_nodes, waiting_moves
from weave_slurm.sim.accounting import reference_site
from weave_slurm.sim.generate import GeneratorConfig, generate_trace
from weave_slurm.sim.policies import Accounting, SimPolicy
from weave_slurm.sim.replay import Replay, ReplayOptions


def _proposals(policy: str, monkeypatch: pytest.MonkeyPatch
               ) -> list[tuple[bool, bool, bool]]:
    """Each re-plan the replay of ``policy`` was offered: (whether it needs nodes, whether
    its waiting moves are safe, whether it was taken)."""
    seen: list[tuple[bool, bool, bool]] = []
    take = Replay._take

    def spy(self: Replay, plan: Replan | None) -> None:
        before: ClusterState = self.state
        take(self, plan)
        if plan is not None:
            seen.append((bool(needs_nodes(before, plan.state)),
                         waiting_moves(before, plan.state) is not None,
                         self.state is not before))

    monkeypatch.setattr(Replay, "_take", spy)
    trace = generate_trace(GeneratorConfig(n_jobs=80, seed=7))
    Replay(trace, Capacity.from_site(reference_site(), 5), SimPolicy.make(policy),
           ReplayOptions(accounting=Accounting.CONSISTENT)).run()
    return seen


def test_weave_live_takes_only_the_moves_weaved_can_carry_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    full = _proposals("weave", monkeypatch)
    assert any(not safe and taken for _, safe, taken in full)   # weave takes any
    live = _proposals("weave-live", monkeypatch)
    assert all(safe for _, safe, taken in live if taken)
    assert any(grows and taken for grows, _, taken in live)     # moves that wait, too
    assert any(grows and not safe and not taken for grows, safe, taken in live)
