"""A member's training gang run alone: its ranks as real processes of one gloo world.

What a group must reproduce bit for bit for a member of a layout of ``W`` training
ranks: each rank a process with its own ``JobRunner`` of the training role (the
runtime's context: rank, local rank, world size, the world's group); rank 0 also holds
the rollout role, rolls out with the weights rank 0 exported and hands the batch to
the others over the world, as a group's rank 0 does (``weave_slurm.hosted.world``).
A layout of ``E`` rollout engines rolls out as ``E`` rollout runners of the engine
context (rank ``e`` of ``E``, no group), each its slice, merged in engine order by the
training runner (``merge_rollouts``), as a group's training step merges them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.harness.solo import SoloResult
from weave_slurm.runtime.group import MemberSpec

_CHILD = r'''
import json, sys, torch, torch.distributed as dist
from weave_slurm.workloads.api import JobContext, Role
from weave_slurm.workloads.entry import start_job
spec = json.loads(sys.argv[1]); rank, world = int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", init_method=spec["init"], rank=rank, world_size=world)
ctx = JobContext(spec["job"], Role.TRAIN, spec["seed"], spec["options"], rank=rank,
                 local_rank=spec["local"][rank], world_size=world, group=dist.group.WORLD)
train = start_job(spec["entry"], ctx)
train.state_tensors()
weights = train.export_weights()
E = spec["engines"]
rolls = [start_job(spec["entry"], JobContext(spec["job"], Role.ROLLOUT, spec["seed"],
                                            spec["options"], rank=e, world_size=E))
         for e in range(E)] if rank == 0 else []
rewards = []
for _ in range(spec["steps"]):
    box = [None]
    if rank == 0:
        for roll in rolls:
            if roll.weights_version != train.weights_version:
                roll.import_weights(weights, train.weights_version)
        parts = [roll.rollout(train.weights_version) for roll in rolls]
        box = [parts[0] if E == 1 else train.merge_rollouts(parts)]
        rewards.append(float(box[0].metrics.get("reward_mean", float("nan"))))
    dist.broadcast_object_list(box, src=0)
    version = train.train(box[0])
    train.state_tensors()
    weights = train.export_weights()
if rank == 0:
    torch.save({"weights": weights, "rewards": rewards, "version": train.weights_version},
               spec["out"])
dist.barrier()      # then no teardown: a peer's closed pairs must not abort a slower rank
import os, sys
sys.stdout.flush()
os._exit(0)
'''


def run_solo_gang(spec: MemberSpec, timeout_s: float = 300.0) -> SoloResult:
    """``spec.steps`` iterations of ``spec``'s training gang (its layout's ranks) and its
    rollout engines alone."""
    assert spec.layout is not None
    lay = spec.layout.train
    world = lay.ranks
    local = [lay.place(r)[1] for r in range(world)]
    with tempfile.TemporaryDirectory(prefix="solo-gang-") as tmp:
        out = Path(tmp) / "rank0.pt"
        args: dict[str, Any] = {"job": spec.job_id, "seed": spec.seed, "entry": spec.entry_point,
                                "options": dict(spec.options), "steps": spec.steps,
                                "init": f"file://{tmp}/store", "local": local, "out": str(out),
                                "engines": spec.layout.rollout.engines}
        import json
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(args), str(r),
                                   str(world)], env=env) for r in range(world)]
        try:
            codes = [p.wait(timeout=timeout_s) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert codes == [0] * world, f"solo gang of {spec.job_id}: exit codes {codes}"
        got = torch.load(out)
    return SoloResult(got["weights"], tuple(got["rewards"]), int(got["version"]))
