"""weave_slurm.workloads: the RL job API and the built-in jobs.

- ``api``: the ``RLJob`` protocol a user job implements and the ``JobRunner`` that tags
  batches with weight versions and enforces the on-policy contract (docs/job_api.md).
- ``entry``: entry points (``builtin:<name>`` or ``package.module:factory``).
- ``grpo_toy``, ``grpo``, ``tasks``: the CPU reference job (tiny Llama, GRPO, digit task).
- ``deepspeed_backend``, ``vllm_backend``: optional training and rollout engines.

Nothing here imports torch at import time.
"""
