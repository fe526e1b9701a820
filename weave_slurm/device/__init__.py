"""The GPU side of a warm switch: host memory the device copies at full rate
(:mod:`~weave_slurm.device.hostmem`), moving a member's device state into its node's
shared memory and back (:mod:`~weave_slurm.device.switch`), and what a switched-out
member still holds on the device (:mod:`~weave_slurm.device.footprint`)."""
