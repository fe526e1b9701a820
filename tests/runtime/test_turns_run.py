"""A member taking two turns per round on real node daemons (LocalBackend, real
processes, real /dev/shm): the training node serves the planned order of turns, and
both members end with their solo weights, bit for bit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.fleet import NodeFleet, running_fleet
from tests.harness.specs import OPTIONS
from tests.runtime.helpers import assert_same_as_solo, leave_all
from weave_slurm.runtime.group import MemberSpec, MemberState
from weave_slurm.runtime.runner import GroupRunner
from weave_slurm.vocab import Phase

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def fleet2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    """One training (h800) and two rollout (h20) node daemons as local processes."""
    with running_fleet(tmp_path_factory.mktemp("turns"), "tu", "weave-test-tu-",
                       rollout_nodes=2) as fleet:
        yield fleet


def test_the_training_node_keeps_to_the_turn_order(fleet2: NodeFleet) -> None:
    long = MemberSpec("long", seed=21, steps=2, options=OPTIONS, rollout_pins=(0,))
    short = MemberSpec("short", seed=22, steps=4, options=OPTIONS, rollout_pins=(1,),
                       turns=2)
    ex = GroupRunner(fleet2.layout, [long, short])
    assert ex.lifecycle.turn_order == ("short", "long", "short")
    try:
        ex.run(timeout_s=240)
        assert [ex.members[j].state for j in ("long", "short")] == [MemberState.DONE] * 2
        steps = [s.job_id for s in sorted(ex.spans, key=lambda s: s.start_s)
                 if s.kind is Phase.TRAIN and s.ok]
        # long trains 3 times (its init, then 2 steps): between its two steps, while
        # both cycle, the node serves exactly the two turns of short the order puts
        # there (served as they came ready, the two would alternate)
        at = [i for i, j in enumerate(steps) if j == "long"]
        assert len(at) == 3 and steps.count("short") == 5, steps
        assert steps[at[1] + 1:at[2]] == ["short", "short"], steps
        for spec in (long, short):
            assert_same_as_solo(ex, spec)
    finally:
        leave_all(ex, [long, short])
