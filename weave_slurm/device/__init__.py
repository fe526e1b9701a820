"""The device switch, whole: freeing a member's GPU memory while another member runs.

- :mod:`~weave_slurm.device.protocols`: what a job offers the switch
  (``SwitchesDevice``, ``OffloadsDevice``; jobs import them from
  :mod:`weave_slurm.workloads.api`, which re-exports them);
- :mod:`~weave_slurm.device.switch`: one job instance's device state into its node's
  shared memory and back (``DeviceSwitch``);
- :mod:`~weave_slurm.device.instances`: the switches of the instances one resident
  worker keeps, and what the worker reports of them;
- :mod:`~weave_slurm.device.hostmem`: host memory the device copies at full rate
  (registered mappings, a pinned staging buffer);
- :mod:`~weave_slurm.device.footprint`: what a worker still holds on the device.

Imports point one way: :mod:`weave_slurm.node` (staging), :mod:`weave_slurm.hosted`
(the worker's entries) and :mod:`weave_slurm.workloads` (the job API and the jobs)
import this package; it imports none of them, only :mod:`weave_slurm.errors` and
:mod:`weave_slurm.vocab`. What it needs of a segment or a job instance it names as a
protocol (:class:`~weave_slurm.device.instances.Scratch`). Which member holds a node's
GPUs is the node daemon's decision (:mod:`weave_slurm.node.tenancy`).
"""
