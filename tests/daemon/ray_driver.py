"""A stand-in for a verl driver (docs/recipes.md, the Ray pattern), small enough for CI:
the train role's Ray driver holds the *train* turn itself; a rollout actor on the
rollout node generates, behind a gate relay that holds the *rollout* turn there. The
driver's loop is the page's example as written (:func:`driver_source`); this module
gives it the names it leaves to the reader (``Rollout``, ``update``, ``steps``,
``weights``).

The "model" is a softmax policy over ``ARMS`` arms (plain floats, no torch: Ray's
worker processes stay small); a rollout samples ``SAMPLES`` arms with a generator
seeded by the version, the driver takes one policy-gradient step on them. Its final
weights and their SHA-256 go to ``result.json`` in the working directory, so two runs
can be compared: they are the same as long as every train consumed the rollout of its
own version.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from pathlib import Path
from typing import Any

import ray

ARMS, SAMPLES, LR = 4, 16, 0.5
REWARD = (0.1, 0.2, 0.9, 0.3)
TRAIL: list[float] = []   # each train's reward baseline, in order


def probs(w: list[float]) -> list[float]:
    z = [math.exp(x - max(w)) for x in w]
    return [x / sum(z) for x in z]


@ray.remote(num_cpus=0)
class Rollout:
    """The rollout engine's stand-in (on the rollout node, as verl's replicas)."""

    def generate(self, weights: list[float], version: int) -> dict[str, object]:
        arms = sample(weights, version)
        return {"version": version, "arms": arms,
                "reward_mean": sum(REWARD[a] for a in arms) / SAMPLES,
                "node": os.environ.get("WEAVE_NODE"), "role": os.environ.get("WEAVE_ROLE")}


def sample(weights: list[float], version: int) -> list[int]:
    return random.Random(version).choices(range(ARMS), weights=probs(weights), k=SAMPLES)


def step(w: list[float], arms: list[int]) -> tuple[list[float], float]:
    """One policy-gradient step on a rollout's arms; the new weights and the baseline."""
    p = probs(w)
    rewards = [REWARD[a] for a in arms]
    base = sum(rewards) / len(rewards)
    grad = [0.0] * ARMS
    for a, r in zip(arms, rewards, strict=True):
        for k in range(ARMS):
            grad[k] += (r - base) * ((k == a) - p[k]) / len(arms)
    return [x + LR * g for x, g in zip(w, grad, strict=True)], base


def update(weights: list[float], batch: dict[str, Any]) -> tuple[list[float], float]:
    """The example's ``update``: the step on the rollout of version ``v`` (the count of
    trains done), made by the rollout role on its h20 node; one line per step."""
    assert batch["role"] == "rollout" and batch["version"] == len(TRAIL), batch
    weights, reward = step(weights, batch["arms"])
    TRAIL.append(round(reward, 6))
    print(f"v{batch['version']} rollout on {batch['node']} reward {reward:.4f}", flush=True)
    return weights, reward


def sha256(weights: list[float]) -> str:
    return hashlib.sha256(json.dumps([round(x, 9) for x in weights]).encode()).hexdigest()


def alone(steps: int) -> str:
    """The final weights' SHA-256 of the same job run alone, without Ray or weave."""
    weights = [0.0] * ARMS
    for v in range(steps):
        weights, _ = step(weights, sample(weights, v))
    return sha256(weights)


#: What the page's example leaves to the reader, before it: its steps and first weights.
PRELUDE = """
steps = int(os.environ["RAY_JOB_STEPS"])
weights = [0.0] * ARMS
"""
#: After it: the final weights' digest and the rewards, for the test.
EPILOGUE = """
finish(weights)
"""


def driver_source(example: str) -> str:
    """The driver script of a job: these stand-ins, then docs/recipes.md's example of
    the Ray pattern as written, then :func:`finish` (one ``__main__``: Ray ships the
    actor class by value)."""
    return Path(__file__).read_text() + PRELUDE + example + EPILOGUE


def finish(weights: list[float]) -> None:
    digest = sha256(weights)
    Path("result.json").write_text(json.dumps({"sha256": digest, "rewards": TRAIL}))
    print(f"driver done: {digest}", flush=True)
