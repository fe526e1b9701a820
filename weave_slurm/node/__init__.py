"""weave_slurm.node."""
