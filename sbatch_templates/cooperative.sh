#!/bin/bash
# A cooperative job: your own processes, one per role (WEAVE_ROLE is rollout or train),
# run this script's body as you; each takes its phases through weave's gate, which
# blocks until the group's turn order reaches the job (docs/job_api.md, "Cooperative
# jobs"). Replace the loop bodies with your framework's rollout and update (vLLM
# generate, a DeepSpeed/FSDP step), and the switch hooks with its offload and reload.
# Outside weave (run by hand) the gate passes through, so the same script runs alone.
# Submit it with `weave-sbatch sbatch_templates/cooperative.sh` from a shell whose
# python has weave-slurm (the job gets your environment, as sbatch --export=ALL).
#SBATCH --job-name=coop --output=%x-%j.out
#WEAVE --cooperative --iterations=5 --slo=2.0
#WEAVE --model-params-b=0.01 --rollout-gpus=1 --train-gpus=1 --max-tokens=64
#WEAVE --rollout-s=1 --train-s=1 --rollout-state-gib=0.01 --train-state-gib=0.01
exec python3 -u - <<'PY'
import os
import random

from weave_slurm import gate

role = os.environ.get("WEAVE_ROLE", "train")
steps = int(os.environ.get("WEAVE_ITERATIONS", "5"))
gate.on_switch_out(lambda turn: print(f"{role}: offload after {turn.phase} v{turn.version}"))
gate.on_switch_in(lambda turn: print(f"{role}: reload before {turn.phase} v{turn.version}"))
rng = random.Random(0)
for v in range(steps):
    with gate.phase(role, version=v) as turn:        # blocks until it is this job's turn
        if role == "rollout":                         # generate with the weights of version v
            turn.report(reward_mean=sum(rng.random() for _ in range(64)) / 64)
        else:                                         # update on rollout v: weights v + 1
            turn.report(loss=1.0 / (v + 1))
    print(f"{role}: version {v} done", flush=True)
PY
