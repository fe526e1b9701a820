"""weave_slurm.slurm: the one door to Slurm, its local stand-in, and the local cluster.

- :mod:`.runner`: every Slurm command runs through here (argv, timeout, evidence).
- :mod:`.backend`: the Backend protocol; :mod:`.cli_backend` (salloc/srun/squeue) and
  :mod:`.local_backend` (plain processes) implement it; :mod:`.factory` picks one.
- :mod:`.cluster`: ``weave cluster up|down|status``, a local Slurm 22.05 cluster whose
  nodes share this host or are hosts of their own (:mod:`.host_plan`, :mod:`.hosts`:
  network, mount and UTS namespaces on a private subnet).
- :mod:`.templates`: scripts rendered from ``weave_slurm/templates/`` (package data).

See docs/slurm.md.
"""
