"""weave_slurm.workloads: the RL job API and the built-in jobs.

- ``api``: the ``RLJob`` protocol a user job implements and the ``JobRunner`` that tags
  batches with weight versions and enforces the on-policy contract (docs/job_api.md).
- ``gang``: what a role's ranks share (shares of work, weight shards and their assembly,
  the merge of engines' rollouts).
- ``entry``: entry points (``builtin:<name>`` or ``package.module:factory``).
- ``grpo_toy``, ``grpo``, ``grpo_options``, ``grpo_model``, ``tasks``: the CPU reference
  job (tiny Llama, GRPO, digit task); ``grpo_fsdp``: its FSDP2 training gang.
- ``deepspeed_backend``, ``vllm_backend``: optional training and rollout engines.

Nothing here imports torch at import time.
"""
