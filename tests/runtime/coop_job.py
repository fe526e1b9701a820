"""A cooperative job for the tests (torch-free): its own two processes, one per role,
take their phases through ``weave_slurm.gate``. The rollout at version ``v`` writes
``traj-<v>.json`` in the working directory, the train at ``v`` reads it (so a train
granted before its rollout ended would crash) and writes ``weights.json`` (version
``v + 1``). Every phase body prints its interval on CLOCK_MONOTONIC, which the test
compares with the runtime's spans.

``COOP_MODE``: ``ok``; ``wrong-version`` (the train process first asks for a train at
version 1, is refused, prints the reason and goes on); ``hang`` (the train at version 1
never ends); ``crash`` (the rollout process dies with status 3 in its rollout at 1).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from weave_slurm import gate
from weave_slurm.errors import GateRefused

ROLE = os.environ["WEAVE_ROLE"]
STEPS = int(os.environ.get("COOP_STEPS", "3"))
MODE = os.environ.get("COOP_MODE", "ok")
BODY_S = float(os.environ.get("COOP_BODY_S", "0.4"))
WORK = Path.cwd()


def rollout(v: int, turn: gate.Turn) -> None:
    if MODE == "crash" and v == 1:
        print(f"{ROLE} v{v} crashes", flush=True)
        os._exit(3)   # dies as a crash does: no exception, no word to the gate
    weights = json.loads((WORK / "weights.json").read_text())["version"] if v else 0
    assert weights == v, f"rollout at {v} sees weights {weights}"
    (WORK / f"traj-{v}.json").write_text(json.dumps({"version": v}))
    turn.report(reward_mean=0.1 * (v + 1))


def train(v: int, turn: gate.Turn) -> None:
    traj = json.loads((WORK / f"traj-{v}.json").read_text())
    assert traj["version"] == v, traj
    (WORK / "weights.json").write_text(json.dumps({"version": v + 1}))
    turn.report(loss=1.0 / (v + 1))      # the reward is the rollout turn's (docs)
    if MODE == "hang" and v == 1:
        print(f"{ROLE} v{v} hangs", flush=True)
        time.sleep(3600)


def main() -> int:
    print(f"{ROLE} of job {os.environ['WEAVE_JOB_ID']} starts in {WORK} on node "
          f"{os.environ.get('WEAVE_NODE')}", flush=True)
    print(f"{ROLE} stderr line", file=sys.stderr, flush=True)
    gate.on_switch_in(lambda t: print(f"switch-in {t.phase} v{t.version}", flush=True))
    gate.on_switch_out(lambda t: print(f"switch-out {t.phase} v{t.version}", flush=True))
    if ROLE == "train" and MODE == "wrong-version":
        try:
            with gate.phase("train", version=1):
                print("train v1 granted: the barrier is broken", flush=True)
        except GateRefused as exc:
            print(f"refused: {exc}", flush=True)
    for v in range(STEPS):
        with gate.phase(ROLE, version=v) as turn:
            t0 = time.monotonic()
            time.sleep(BODY_S)
            (rollout if ROLE == "rollout" else train)(v, turn)
            print(f"body {ROLE} v{v} {t0:.6f} {time.monotonic():.6f}", flush=True)
    print(f"{ROLE} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
