"""weave_slurm.placement."""
