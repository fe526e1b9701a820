"""weave_slurm.cli."""
