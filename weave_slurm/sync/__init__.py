"""weave_slurm.sync: two-tier weight synchronisation, the one door to collective comms.

After each training step a job's new weights go to its rollout ranks in two tiers:
one sharded copy across the slow inter-pool link (parallel point-to-point streams,
:mod:`~weave_slurm.sync.twotier`), then an all-gather inside the rollout pool. Every
piece is tagged with (job, version) and checksummed; stale or duplicate versions are
refused (:class:`weave_slurm.errors.VersionMismatch`), corrupt pieces are retried once,
and a delta mode (:mod:`~weave_slurm.sync.delta`) sends only changed words. Modules:
``topology`` (who is where, stream plan; pure), ``layout`` (flat byte layout of
weights), ``header``/``ledger`` (wire protocol, versions), ``transport``/``mpi``
(torch.distributed and mpi4py), ``baselines`` (naive pull, flat broadcast),
``linkemu`` (namespaces + shaped veth), ``scenario``/``worker``/``launch`` (running a
group as real processes; ``python -m weave_slurm.sync.group_launch`` is the standalone entry).
Nothing is imported here, so importing the package does not import torch.
"""
