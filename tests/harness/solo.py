"""A member run alone, in one process: the reference co-execution must reproduce.

Rollout and training roles are separate ``JobRunner`` instances (as on two pools),
weights cross between them through ``export_weights``/``import_weights`` exactly as
docs/job_api.md describes one iteration. Same seed -> the group must reach the same
weights, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from weave_slurm.hosted.contract import rollout_version
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.workloads.api import JobContext, Role
from weave_slurm.workloads.entry import start_job

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class SoloResult:
    weights: dict[str, Tensor]
    rewards: tuple[float, ...]
    version: int


def run_solo(spec: MemberSpec, steps: int | None = None,
             staleness: int | None = None) -> SoloResult:
    """``steps`` iterations (default ``spec.steps``) of the member alone.

    ``staleness`` (default ``spec.staleness``) is the window k: the rollout of step
    ``m`` uses exactly the weights of version ``max(0, m - k)``, as in a group.
    """
    k = spec.staleness if staleness is None else staleness
    options = dict(spec.options)
    train = start_job(spec.entry_point, JobContext(spec.job_id, Role.TRAIN, spec.seed, options),
                      staleness=k)
    roll = start_job(spec.entry_point, JobContext(spec.job_id, Role.ROLLOUT, spec.seed, options),
                     staleness=k)
    history = {0: train.export_weights()}     # the versions a later rollout may still need
    rewards = []
    for step in range(spec.steps if steps is None else steps):
        want = rollout_version(step, k)
        if roll.weights_version != want:
            roll.import_weights(history[want], want)
        batch = roll.rollout(want)
        rewards.append(float(batch.metrics.get("reward_mean", float("nan"))))
        version = train.train(batch)
        history[version] = train.export_weights()
        history.pop(version - k - 1, None)
    return SoloResult(train.export_weights(), tuple(rewards), train.weights_version)
