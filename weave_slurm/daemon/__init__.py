"""weave_slurm.daemon."""
