"""weave_slurm.workloads."""
