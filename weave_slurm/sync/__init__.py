"""weave_slurm.sync."""
