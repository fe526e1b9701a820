"""weave_slurm.runtime."""
