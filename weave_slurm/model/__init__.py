"""weave_slurm.model."""
