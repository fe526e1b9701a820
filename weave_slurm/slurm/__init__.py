"""weave_slurm.slurm: the one door to Slurm, its local stand-in, and the local cluster.

- :mod:`.command_runner`: every Slurm command runs through here (argv, timeout, evidence).
- :mod:`.backend`: the Backend protocol; :mod:`.cli_backend` (sbatch/srun/squeue) and
  :mod:`.local_backend` (plain processes) implement it; :mod:`.factory` picks one.
- :mod:`.local_cluster`: ``weave cluster up|down|status``, a local Slurm 22.05 cluster whose
  nodes share this host or are hosts of their own (:mod:`.host_plan`, :mod:`.hosts`:
  network, mount and UTS namespaces on a private subnet).
- :mod:`.templates`: the allocation script weaved submits, rendered from
  ``sbatch_templates/allocation.sbatch`` (package data) or the site's own.

See docs/slurm.md.
"""
