#!/bin/bash
# TRL's GRPOTrainer as a hosted #WEAVE script: builtin:trl-grpo-tiny is a 2-layer random
# Llama trained by GRPO to copy two digits (weave_slurm/workloads/trl_tiny.py), run by
# weave's workers through its TRL adapter, with no model hub (HF_HUB_OFFLINE=1). Needs
# the `trl` extra in the workers' Python. For your own TRL job, copy this file and set
# --entry to your factory (docs/job_api.md, "TRL's GRPOTrainer"). Submit it with
# `weave-sbatch sbatch_templates/trl-grpo.sh` (`--iterations=N` for a shorter run).
#SBATCH --job-name=trl-grpo
#WEAVE --entry=builtin:trl-grpo-tiny --algorithm=grpo --iterations=300 --seed=0 --slo=3.0
#WEAVE --model-params-b=0.0001 --rollout-gpus=1 --train-gpus=1 --max-tokens=3
#WEAVE --prompts-per-step=4 --samples-per-prompt=8
#WEAVE --rollout-s=1 --train-s=1 --rollout-state-gib=0.01 --train-state-gib=0.01
