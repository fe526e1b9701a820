"""weave_slurm.config."""
