"""weave_slurm.slurm."""
