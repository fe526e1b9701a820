#!/bin/bash
# A hosted job as a #WEAVE script: weave's workers run the job's RLJob (here the
# reference GRPO job, builtin:grpo-toy, a small Llama learning a digit task on CPU) on
# one rollout GPU and one training GPU; weave keeps its state warm between turns.
# For a job of your own, copy this file and set --entry to your factory
# (--entry=my_pkg.job:make, importable by the workers' Python: --python, --pythonpath;
# docs/job_api.md). Submit it with `weave-sbatch sbatch_templates/hosted-grpo.sh`; flags
# override these lines (`weave-sbatch --slo 1.5 --iterations=5 ...`). The body of a
# hosted job's script is not run (docs/daemon.md, "#WEAVE and #SBATCH directives").
#SBATCH --job-name=grpo-toy
#WEAVE --entry=builtin:grpo-toy --algorithm=grpo --iterations=20 --seed=1
#WEAVE --model-params-b=0.01 --rollout-gpus=1 --train-gpus=1 --max-tokens=64
