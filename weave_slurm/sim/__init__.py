"""weave_slurm.sim."""
