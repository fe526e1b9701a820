"""The on-policy decision on a cooperative job's gate waits (runtime/cooperative.py
``judge``, pure): its phases are one sequence rollout 0, train 0, rollout 1, ...; the
next one is granted, the one after it waits, any other is refused in one line."""

from __future__ import annotations

import pytest

from weave_slurm.runtime.cooperative import Verdict, judge
from weave_slurm.vocab import Phase

R, T = Phase.ROLLOUT, Phase.TRAIN
NONE: frozenset[Phase] = frozenset()


@pytest.mark.parametrize(("phase", "version", "at", "rolled", "running", "verdict"), [
    (R, 0, 0, 0, NONE, Verdict.READY),             # the first phase
    (T, 0, 0, 0, NONE, Verdict.WAIT),              # its rollout comes first
    (T, 0, 0, 0, frozenset({R}), Verdict.WAIT),    # ... and runs now
    (T, 0, 0, 1, NONE, Verdict.READY),             # rollout 0 ended
    (R, 1, 0, 1, NONE, Verdict.WAIT),              # train 0 comes first
    (R, 1, 0, 1, frozenset({T}), Verdict.WAIT),
    (R, 0, 0, 0, frozenset({R}), Verdict.WAIT),    # granted, being picked up
    (R, 1, 0, 0, frozenset({R}), Verdict.WAIT),    # rollout 0 ended on the node only
    (R, 1, 1, 1, NONE, Verdict.READY),
    (T, 1, 0, 0, NONE, Verdict.REFUSE),            # no rollout at version 1
    (T, 0, 1, 1, NONE, Verdict.REFUSE),            # trained already
    (R, 0, 1, 1, NONE, Verdict.REFUSE),            # its weights moved on
    (R, 2, 0, 0, NONE, Verdict.REFUSE),            # skips its own rollout 0
    (R, 3, 3, 3, NONE, Verdict.REFUSE),            # past its iterations (3)
])
def test_judge(phase: Phase, version: int, at: int, rolled: int,
               running: frozenset[Phase], verdict: Verdict) -> None:
    got, why = judge(phase, version, at=at, rolled=rolled, steps=3, running=running)
    assert got is verdict, (got, why)
    assert (why != "") is (verdict is Verdict.REFUSE) and "\n" not in why


def test_refusals_say_why() -> None:
    _, why = judge(T, 1, at=0, rolled=0, steps=3, running=NONE)
    assert why == ("train at version 1 refused: no rollout at version 1 ended (on-policy: "
                   "a train consumes the rollout of its own version); the job is at version "
                   "0, its next train is at version 0")
    _, why = judge(R, 0, at=1, rolled=1, steps=3, running=NONE)
    assert why == ("rollout at version 0 refused: the job's weights are at version 1; its "
                   "next rollout is at version 1")
    _, why = judge(R, 3, at=3, rolled=3, steps=3, running=NONE)
    assert why == "rollout at version 3 refused: the job ends at version 3 (its spec's " \
        "iterations)"
