"""Worker side of the job-level warm/cold measurement of ``bench/warm_switch.py``.

The job is the project's reference job (``builtin:grpo-toy``: a transformers Llama
built from its config with random weights, trained by GRPO), scaled by its options.
This file is used in two ways:

* as entries of the job's **resident worker** (forked by the node daemon's zygote;
  loaded by file path): ``init`` builds the job, trains one step so that the Adam
  moments exist, and puts ``state``, ``weights`` and ``traj`` into the node's shared
  memory; ``warm`` is one phase switch (``rollout``: install ``weights`` from shm,
  ``train``: load ``state`` from shm) up to the first useful work; ``release`` frees
  what the worker holds;
* as a **fresh process** started by the node daemon (``python warm_switch_job.py cold
  ROLE CKPT_DIR OUT OPTIONS``): imports torch + transformers + the job, builds the
  model, reads the job's checkpoint written by the node daemon (``state`` for train,
  ``weights`` for rollout) and loads it, then the same first useful work.

First useful work (``first_work``), the same on both sides:

* rollout: the first generated token: the first decode step's forward, sampling and
  append are done (timed when the second decode step's forward starts);
* train: the first forward of the training step (the policy's forward that computes
  the old log-probabilities, before any backward or optimizer step).

The phase is stopped right after it (nothing of the job's state changes), so repeats
measure the same work.
"""

from __future__ import annotations

import time

T_START = time.monotonic()  # a cold process: the interpreter reached this file

import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from weave_slurm.node.resident import PhaseContext
    from weave_slurm.workloads.api import JobRunner, TrajectoryBatch

ENTRY_POINT = "builtin:grpo-toy"
JOB_ID = "bench"
SEED = 7
ROLES = ("rollout", "train")

_RUNNERS: dict[str, JobRunner] = {}


class _FirstWorkDone(Exception):
    """Raised by the timing hook to stop the phase after its first useful work."""


def first_work(runner: JobRunner, role: str, batch: TrajectoryBatch | None) -> float:
    """Run ``role`` until its first useful work is done; returns that monotonic time."""
    policy = getattr(runner.job, "policy", None)
    if policy is None:
        raise TypeError(f"{ENTRY_POINT}: the job has no 'policy' module to time")
    seen: list[float] = []

    def before_forward(module: object, args: object) -> None:
        seen.append(time.monotonic())
        if len(seen) == 2:      # decode step 2 starts: token 1 is sampled and appended
            raise _FirstWorkDone

    def after_forward(module: object, args: object, output: object) -> None:
        seen.append(time.monotonic())
        raise _FirstWorkDone

    if role == "rollout":
        handle = policy.register_forward_pre_hook(before_forward)
    else:
        handle = policy.register_forward_hook(after_forward)
    try:
        if role == "rollout":
            runner.rollout(runner.weights_version)
            seen.append(time.monotonic())   # a one-token response: its end is the token
        else:
            assert batch is not None
            runner.train(batch)
            raise RuntimeError("the training step finished without a policy forward")
    except _FirstWorkDone:
        pass
    finally:
        handle.remove()
    return seen[-1]


def _context(role: str, options: dict[str, Any]) -> Any:
    from weave_slurm.workloads.api import JobContext, Role

    return JobContext(JOB_ID, Role.ROLLOUT if role == "rollout" else Role.TRAIN, SEED,
                      options)


def _batch(traj: Any) -> TrajectoryBatch:
    """The training batch from the ``traj`` segment (an ``AttachedState``)."""
    from weave_slurm.workloads.api import Trajectories, TrajectoryBatch

    return TrajectoryBatch(JOB_ID, traj.index.version,
                           Trajectories({k: v.clone() for k, v in traj.tensors.items()},
                                        dict(traj.index.extra.get("metrics", {}))))


# -- entries of the resident worker ---------------------------------------------------
def init(ctx: PhaseContext) -> dict[str, Any]:
    """Build both roles, train one step (Adam moments exist), put the warm state."""
    from weave_slurm.node.node_client import NodeClient
    from weave_slurm.workloads.entry import start_job

    options = json.loads(ctx.args[0])
    t0 = time.monotonic()
    trainer = start_job(ENTRY_POINT, _context("train", options))
    t_built = time.monotonic()
    trainer.train(trainer.rollout(0))
    batch = trainer.rollout(trainer.weights_version)
    for p in trainer.job.policy.parameters():   # type: ignore[attr-defined]
        p.grad = None                           # the state does not hold gradients
    t_step = time.monotonic()
    state, weights = trainer.state_tensors(), trainer.export_weights()
    traj = {k: v.contiguous() for k, v in batch.trajectories.tensors.items()}
    state_bytes = sum(t.numel() * t.element_size() for t in state.values())
    with NodeClient(Path(os.environ["WEAVE_NODE_SOCKET"]), timeout_s=1800) as client:
        client.put_state(ctx.job, "state", state, trainer.weights_version)
        client.put_state(ctx.job, "weights", weights, trainer.weights_version)
        client.put_state(ctx.job, "traj", traj, batch.weights_version,
                         extra={"metrics": dict(batch.metrics)})
    del state, weights
    t_put = time.monotonic()
    _RUNNERS["train"] = trainer
    _RUNNERS["rollout"] = start_job(ENTRY_POINT, _context("rollout", options))
    return {"params": sum(p.numel() for p in trainer.job.policy.parameters()),  # type: ignore[attr-defined]
            "state_bytes": state_bytes, "build_train_s": t_built - t0,
            "init_step_s": t_step - t_built, "put_s": t_put - t_step,
            "version": trainer.weights_version}


def warm(ctx: PhaseContext) -> dict[str, Any]:
    """One warm switch: args ``[role, "load" | "copy" | "held"]``. ``load``: as the
    runtime does it (rollout: bind the weights segment zero-copy; train: load the state
    into the worker's own memory); ``copy``: rollout copying the weights instead;
    ``held``: no load (the worker already holds this version, as phases.py does between
    its own training phases)."""
    t_entry, cpu_entry = time.monotonic(), time.process_time()
    role, mode = ctx.args[0], ctx.args[1]
    runner = _RUNNERS[role]
    batch = None
    if role == "rollout":
        seg = ctx.state["weights"]
        if mode in ("load", "copy"):   # load: the runtime's zero-copy bind (phases.rollout)
            runner.import_weights(seg.tensors, seg.index.version, borrow=mode == "load")
    else:
        if mode == "load":
            runner.load_state(ctx.state["state"].tensors)
        batch = _batch(ctx.state["traj"])
    t_loaded, cpu_loaded = time.monotonic(), time.process_time()
    t_first = first_work(runner, role, batch)
    return {"t_entry": t_entry, "t_loaded": t_loaded, "t_first": t_first,
            "cpu_load_s": cpu_loaded - cpu_entry,
            "cpu_first_work_s": time.process_time() - cpu_loaded}


def release(ctx: PhaseContext) -> dict[str, Any]:
    """Free the runners (before the cold runs, so memory is not held twice)."""
    _RUNNERS.clear()
    gc.collect()
    return {"released": True}


# -- the cold process -------------------------------------------------------------------
def cold(role: str, ckpt: Path, out: Path, options: dict[str, Any]) -> None:
    import torch
    import transformers  # noqa: F401  (the framework import is part of a cold start)
    from transformers import LlamaForCausalLM  # noqa: F401

    from weave_slurm.node.checkpoint import read_segment
    from weave_slurm.node.worker import attach_from_env
    from weave_slurm.workloads.entry import start_job
    from weave_slurm.workloads.grpo_toy import GrpoToyJob  # noqa: F401

    t_imported = time.monotonic()
    runner = start_job(ENTRY_POINT, _context(role, options))
    t_built = time.monotonic()
    index, tensors = read_segment(ckpt, "weights" if role == "rollout" else "state")
    t_read = time.monotonic()
    batch = None
    if role == "rollout":
        runner.import_weights(tensors, index.version)
    else:
        runner.load_state(tensors)
        batch = _batch(attach_from_env()["traj"])
    del tensors
    t_loaded, cpu_loaded = time.monotonic(), time.process_time()
    t_first = first_work(runner, role, batch)
    cpu_first = time.process_time() - cpu_loaded
    out.write_text(json.dumps({"t_start": T_START, "t_imported": t_imported,
                               "t_built": t_built, "t_read": t_read,
                               "t_loaded": t_loaded, "t_first": t_first,
                               "cpu_total_s": time.process_time(),
                               "cpu_first_work_s": cpu_first,
                               "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "cold" or sys.argv[2] not in ROLES:
        sys.exit(f"usage: {sys.argv[0]} cold {{rollout|train}} CKPT_DIR OUT OPTIONS_JSON")
    cold(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), json.loads(sys.argv[5]))
