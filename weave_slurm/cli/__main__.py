"""``python -m weave_slurm.cli`` runs the ``weave`` command."""

from weave_slurm.cli.main import main

main()
