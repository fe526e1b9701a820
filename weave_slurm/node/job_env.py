"""What each process of a job finds in its environment, as Slurm and torchrun give it.

Code written for Slurm or torchrun finds its place from the environment. A job's
processes run on nodes of the group's allocations (the node daemon is a step of one),
so each gets:

- ``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_CLUSTER_NAME``: the allocation it
  runs in (the node daemon's own; absent on the local backend);
- ``SLURM_JOB_NAME``: the weave job's name; ``SLURMD_NODENAME``: this node;
- ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``: its rank in its job's gang,
  its rank on this node, the gang's size (a cooperative job's role process: 0, 0, 1);
- ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``:
  torchrun's, for a rank of a training gang, where its world meets (a single process
  gets none of them: with them and no world, accelerate and TRL try a rendezvous);
- the ``WEAVE_*`` variables weave sets (docs/job_api.md, "The job's environment").

The values inherited from the node daemon's own step (``SLURM_STEP_ID``,
``SLURM_PROCID`` of the daemon...) are replaced, never left to say something about
another process.

``CUDA_VISIBLE_DEVICES`` names the member's GPUs on this node, as weave assigned them
(``gpus``: its layout's ranks, or engines x GPUs per engine, on this node, which the
runtime sends): the first ``gpus`` of the node's own GPUs, where the allocation named
them to the node daemon (Slurm's ``CUDA_VISIBLE_DEVICES`` of its step, kept as
``WEAVE_NODE_GPUS``), else indices ``0..gpus-1`` (a node without a GPU list, such as
the CPU test nodes). A rank's ``LOCAL_RANK`` indexes that list (``hosted/world.py``);
a resident worker's CUDA context, once made, keeps the devices it first saw.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

#: Taken from the node daemon's environment: the allocation the job's processes run in.
ALLOCATION_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CLUSTER_NAME")
#: The node's GPUs as its allocation named them to the node daemon (what each job's
#: ``CUDA_VISIBLE_DEVICES`` is taken from once a resident worker's own was set).
NODE_GPUS = "WEAVE_NODE_GPUS"
#: Set by a step for its own tasks: never passed on from the node daemon's step.
STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
             "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASK_PID",
             "SLURM_NODEID", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE")


def job_environment(*, node: str, job_name: str | None, rank: int = 0, local_rank: int = 0,
                    world_size: int = 1, init_method: str | None = None,
                    daemon_env: Mapping[str, str] | None = None,
                    gpus: int | None = None) -> dict[str, str]:
    """The variables one process of a job gets (module doc); ``gpus``: the member's GPUs
    on this node (None: not known, ``CUDA_VISIBLE_DEVICES`` left as it is)."""
    source = os.environ if daemon_env is None else daemon_env
    env = {k: source[k] for k in ALLOCATION_VARS if source.get(k)}
    if gpus is not None:
        env.update(visible_devices(gpus, source))
    env.update({"SLURMD_NODENAME": node, "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(local_rank), "SLURM_NTASKS": str(world_size)})
    if job_name:
        env["SLURM_JOB_NAME"] = job_name
    where = urlsplit(init_method or "")
    if where.scheme == "tcp" and where.hostname and where.port:
        # torchrun's, only where a world meets: with RANK/WORLD_SIZE and no MASTER_ADDR,
        # accelerate and TRL would try an env:// rendezvous for a single process
        env.update({"RANK": str(rank), "LOCAL_RANK": str(local_rank),
                    "WORLD_SIZE": str(world_size), "MASTER_ADDR": where.hostname,
                    "MASTER_PORT": str(where.port)})
    return env


def visible_devices(gpus: int, source: Mapping[str, str]) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` for ``gpus`` GPUs of this node, and ``WEAVE_NODE_GPUS``,
    the node's own list it was taken from (module doc)."""
    ids = node_gpus(source)
    mine = ids[:gpus] if ids else [str(i) for i in range(gpus)]
    return {"CUDA_VISIBLE_DEVICES": ",".join(mine), NODE_GPUS: ",".join(ids)}


def node_gpus(source: Mapping[str, str]) -> list[str]:
    """The node's GPUs as its allocation named them to the node daemon (its step's
    ``CUDA_VISIBLE_DEVICES``, kept as ``WEAVE_NODE_GPUS``): a share's only (module doc)."""
    node = source[NODE_GPUS] if NODE_GPUS in source else \
        source.get("CUDA_VISIBLE_DEVICES", "")
    return [i.strip() for i in node.split(",") if i.strip()]


def apply(env: Mapping[str, str]) -> None:
    """Put ``env`` into this process's environment, without the node daemon's step's
    own variables (a resident worker, at the start of each phase)."""
    for key in STEP_VARS:
        os.environ.pop(key, None)
    os.environ.update(env)
