"""weave-slurm: co-execution of synchronous RL post-training jobs on Slurm.

Glossary (see docs/glossary.md for the long form):

- job: one synchronous RL training run (rollout -> sync -> train, repeated).
- phase: rollout, sync or train.
- pool: the nodes of one GPU kind (h20 for rollout, h800 for training).
- group: a co-execution group: member jobs plus the rollout and training nodes they share.
- meta-iteration: one round of the cyclic schedule in which every member runs one
  rollout and one training phase.
- slot: a member's place in a node's cyclic phase order.
- bubble: time a pool is paid for and idle.
- warm state: a job's state held in host shared memory so a switch is a copy, not a reload.
"""

__version__ = "0.1.0"
