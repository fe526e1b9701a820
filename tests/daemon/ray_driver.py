"""A stand-in for a verl driver (docs/recipes.md, the Ray pattern), small enough for CI:
the train role's Ray driver holds the *train* turn itself; a rollout actor on the
rollout node generates, behind a gate relay that holds the *rollout* turn there.

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
import sys
from pathlib import Path

import ray

from weave_slurm import gate, ray_member

ARMS, SAMPLES, LR = 4, 16, 0.5
REWARD = (0.1, 0.2, 0.9, 0.3)


def probs(w: list[float]) -> list[float]:
    z = [math.exp(x - max(w)) for x in w]
    return [x / sum(z) for x in z]


@ray.remote(num_cpus=0)
class Rollout:
    """The rollout engine's stand-in (on the rollout node, as verl's replicas)."""

    def ready(self) -> str:
        return os.environ.get("WEAVE_NODE", "")

    def generate(self, weights: list[float], version: int) -> dict[str, object]:
        return {"version": version, "arms": sample(weights, version),
                "node": os.environ.get("WEAVE_NODE"), "role": os.environ.get("WEAVE_ROLE")}


def sample(weights: list[float], version: int) -> list[int]:
    return random.Random(version).choices(range(ARMS), weights=probs(weights), k=SAMPLES)


def update(w: list[float], arms: list[int]) -> tuple[list[float], float]:
    p = probs(w)
    rewards = [REWARD[a] for a in arms]
    base = sum(rewards) / len(rewards)
    grad = [0.0] * ARMS
    for a, r in zip(arms, rewards, strict=True):
        for k in range(ARMS):
            grad[k] += (r - base) * ((k == a) - p[k]) / len(arms)
    return [x + LR * g for x, g in zip(w, grad, strict=True)], base


def sha256(weights: list[float]) -> str:
    return hashlib.sha256(json.dumps([round(x, 9) for x in weights]).encode()).hexdigest()


def alone(steps: int) -> str:
    """The final weights' SHA-256 of the same job run alone, without Ray or weave."""
    weights = [0.0] * ARMS
    for v in range(steps):
        weights, _ = update(weights, sample(weights, v))
    return sha256(weights)


def main() -> int:
    steps = int(os.environ["RAY_JOB_STEPS"])
    ray_member.init(logging_level="warning")
    where = ray_member.on_rollout_node()
    relay = ray_member.gate_relay().options(scheduling_strategy=where).remote()
    engine = Rollout.options(scheduling_strategy=where).remote()   # type: ignore[attr-defined]
    ray.get(engine.ready.remote())   # started before the loop, as verl's init_workers
    weights, trail = [0.0] * ARMS, []
    for v in range(steps):
        ray.get(relay.enter.remote(v))                 # the rollout turn, on its node
        batch = ray.get(engine.generate.remote(weights, v))
        assert batch["role"] == "rollout" and batch["version"] == v, batch
        reward = sum(REWARD[a] for a in batch["arms"]) / SAMPLES
        ray.get(relay.leave.remote(reward_mean=reward))
        with gate.phase("train", version=v) as turn:   # as soon as the rollout turn ended
            weights, reward = update(weights, batch["arms"])
            turn.report(reward_mean=reward)
        trail.append(round(reward, 6))
        print(f"v{v} rollout on {batch['node']} reward {reward:.4f}", flush=True)
    digest = sha256(weights)
    Path("result.json").write_text(json.dumps({"sha256": digest, "rewards": trail}))
    print(f"driver done: {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
