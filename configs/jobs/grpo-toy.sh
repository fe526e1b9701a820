#!/bin/bash
# A hosted job written as a script: the reference GRPO job (builtin:grpo-toy, a small
# Llama learning a digit task on CPU) on one rollout GPU and one training GPU.
# Submit it with `weave-sbatch configs/jobs/grpo-toy.sh`; flags override these lines
# (`weave-sbatch --slo 1.5 --iterations=5 ...`). The body of a hosted job's script is
# not run (docs/daemon.md, "#WEAVE and #SBATCH directives").
#SBATCH --job-name=grpo-toy
#WEAVE --entry=builtin:grpo-toy --algorithm=grpo --iterations=20 --seed=1
#WEAVE --model-params-b=0.01 --rollout-gpus=1 --train-gpus=1 --max-tokens=64
