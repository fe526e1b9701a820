"""Weave-hosted jobs on the compute nodes (runs in the resident workers).

A hosted job implements the ``RLJob`` protocol (:mod:`weave_slurm.workloads.api`) and
weave owns its processes: weaved's group runner (:mod:`weave_slurm.runtime`) asks a
node daemon to activate one of the entries of :mod:`weave_slurm.hosted.phases` in the
job's resident worker. :mod:`weave_slurm.hosted.contract` is what both sides agree on
(segment names, phase arguments, buffer names); it is pure and imports no torch.
"""
