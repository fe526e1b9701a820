"""The local backend: the Backend interface on plain processes, no Slurm.

Virtual nodes come from a :class:`~weave_slurm.slurm.cluster_config.ClusterLayout`
(default 2 h20 + 2 h800 nodes of 8 GPUs). Allocations are bookkeeping records in
``<state_dir>/local_backend.json`` (guarded by a file lock), so a restarted
process adopts them exactly as the Slurm backend adopts jobs by name and comment.
A step is one subprocess per task with the environment a Slurm task would see
(``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURM_PROCID``, ``SLURMD_NODENAME``,
``CUDA_VISIBLE_DEVICES``...). Like Slurm 22.05 steps under ``--overlap``, steps
share CPUs and GPUs: a step asking for N GPUs per node sees the first N of its
allocation's GPUs on each node; a step asking for none sees all of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from weave_slurm.errors import ConfigError, InfeasibleRequest, InsufficientResources, StateError
from weave_slurm.slurm import daemons
from weave_slurm.slurm.allocation_watch import LOCAL_STATE_ENV
from weave_slurm.slurm.backend import (
    NAME_PREFIX,
    AllocatedComponent,
    Allocation,
    AllocationRequest,
    AllocationState,
    NodeInfo,
    ResourceSpec,
    StepHandle,
    StepInfo,
    StepSpec,
    StepState,
    StepStatus,
    parse_comment,
)
from weave_slurm.slurm.cluster_config import ClusterLayout, PoolShape
from weave_slurm.slurm.command_runner import PipedProcess

log = logging.getLogger(__name__)

STATE_FILE = "local_backend.json"
State = dict[str, Any]


@dataclass
class _Launched:
    procs: list[subprocess.Popen[bytes]]
    cancelled: bool = False


@dataclass
class _Usage:
    gpus: dict[str, set[int]] = field(default_factory=dict)
    cpus: dict[str, int] = field(default_factory=dict)


def _spread(ntasks: int, nodes: list[str]) -> list[str]:
    """Block distribution: the node of each task, as even as possible, in order."""
    base, extra = divmod(ntasks, len(nodes))
    return [n for i, n in enumerate(nodes) for _ in range(base + (1 if i < extra else 0))]


class LocalBackend:
    """:class:`~weave_slurm.slurm.backend.Backend` on local processes."""

    kind = "local"

    def __init__(self, state_dir: Path, layout: ClusterLayout | None = None) -> None:
        self.layout = layout or ClusterLayout()
        self.layout.validate()
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self._path = state_dir / STATE_FILE
        self._lock = FileLock(str(self._path) + ".lock")
        self._launched: dict[tuple[str, str], _Launched] = {}
        self.uid = os.getuid()   # whose allocations are listed

    # -- persistent state --------------------------------------------------------------

    @contextlib.contextmanager
    def _state(self) -> Iterator[State]:
        """Load, yield for changes, and atomically save the state, under the file lock."""
        with self._lock:
            try:
                state: State = json.loads(self._path.read_text())
            except FileNotFoundError:
                state = {"next_id": 1, "allocations": {}}
            except ValueError as exc:
                raise StateError(f"{self._path}: corrupt local backend state ({exc}); move "
                                 "it away to start afresh") from exc
            self._prune(state)
            yield state
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
            os.replace(tmp, self._path)

    @staticmethod
    def _prune(state: State) -> None:
        """Adopt tasks of interrupted launches, then forget steps whose tasks all exited."""
        for alloc in state["allocations"].values():
            steps = alloc.get("steps", {})
            for step in steps.values():
                if "launching_since" in step:
                    _adopt_launching(step)
            alloc["steps"] = {
                name: step for name, step in steps.items()
                if "launching_since" in step
                or any(daemons.process_alive(pid, ticks) for pid, ticks in step["tasks"])}

    def _pool(self, partition: str) -> PoolShape:
        for pool in self.layout.pools:
            if pool.partition == partition:
                return pool
        valid = [p.partition for p in self.layout.pools]
        raise InfeasibleRequest(f"local backend: partition {partition!r} does not exist; "
                                f"valid: {valid}")

    def _usage(self, state: State) -> _Usage:
        usage = _Usage()
        for alloc in state["allocations"].values():
            for comp in alloc["components"]:
                for node, idx in comp["gpus"].items():
                    usage.gpus.setdefault(node, set()).update(idx)
                    usage.cpus[node] = usage.cpus.get(node, 0) + comp["cpus_per_node"]
        return usage

    # -- allocations -------------------------------------------------------------------

    def _check_shape(self, spec: ResourceSpec, name: str) -> PoolShape:
        pool = self._pool(spec.partition)
        if spec.gpu_type is not None and spec.gpu_type != pool.gpu_type:
            raise InfeasibleRequest(f"{name}: partition {spec.partition!r} has GPU type "
                                    f"{pool.gpu_type!r}, not {spec.gpu_type!r}")
        for key, want, have in (("node_count", spec.node_count, pool.node_count),
                                ("gpus_per_node", spec.gpus_per_node, pool.gpus_per_node),
                                ("cpus_per_node", spec.cpus_per_node, pool.cpus_per_node)):
            if want > have:
                raise InfeasibleRequest(f"{name}: {key}={want} but partition "
                                        f"{spec.partition!r} has {have}")
        return pool

    def allocate(self, request: AllocationRequest) -> Allocation:
        request.validate()
        pools = [self._check_shape(c, request.job_name) for c in request.components]
        with self._state() as state:
            usage = self._usage(state)
            comps = []
            for spec, pool in zip(request.components, pools, strict=True):
                chosen = []
                for node in pool.node_names():
                    used = usage.gpus.get(node, set())
                    free_gpus = [i for i in range(pool.gpus_per_node) if i not in used]
                    free_cpus = pool.cpus_per_node - usage.cpus.get(node, 0)
                    if len(free_gpus) >= spec.gpus_per_node and free_cpus >= spec.cpus_per_node:
                        take = free_gpus[:spec.gpus_per_node]
                        chosen.append((node, take))
                        usage.gpus.setdefault(node, set()).update(take)
                        usage.cpus[node] = usage.cpus.get(node, 0) + spec.cpus_per_node
                    if len(chosen) == spec.node_count:
                        break
                if len(chosen) < spec.node_count:
                    raise InsufficientResources(
                        f"local backend: {request.job_name}: only {len(chosen)} of "
                        f"{spec.node_count} {spec.partition} nodes have {spec.gpus_per_node} "
                        f"GPUs and {spec.cpus_per_node} CPUs free now; retry later")
                comps.append({"partition": spec.partition, "gpu_type": pool.gpu_type,
                              "cpus_per_node": spec.cpus_per_node,
                              "gpus_per_node": spec.gpus_per_node,
                              "nodes": [n for n, _ in chosen],
                              "gpus": {n: g for n, g in chosen}})
            alloc_id = str(state["next_id"])
            state["next_id"] += 1
            state["allocations"][alloc_id] = {"name": request.job_name,
                                              "comment": request.comment, "uid": self.uid,
                                              "components": comps, "steps": {},
                                              "next_step": 0,
                                              # what Slurm would charge it to
                                              "account": request.account,
                                              "qos": request.qos,
                                              "time_limit_min": request.time_limit_min}
            record = state["allocations"][alloc_id]
        log.info("local allocation %s (%s)", alloc_id, request.job_name)
        return self._to_allocation(alloc_id, record)

    @staticmethod
    def _to_allocation(alloc_id: str, rec: State) -> Allocation:
        tag = parse_comment(rec["comment"])
        comps = tuple(AllocatedComponent(
            partition=c["partition"], nodes=tuple(c["nodes"]), gpus_per_node=c["gpus_per_node"],
            gpu_type=c["gpu_type"], cpus=c["cpus_per_node"] * len(c["nodes"]))
            for c in rec["components"])
        return Allocation(alloc_id, rec["name"], tag.group_id if tag else None,
                          tag.pool if tag else None, AllocationState.RUNNING, comps,
                          tag.instance if tag else None)

    def _owned(self, rec: State, prefix: str, instance: str | None) -> bool:
        """As on Slurm: this uid's (a record from before uids were kept is the state
        dir's owner's), named ``prefix...`` and, given ``instance``, tagged with it."""
        tag = parse_comment(rec["comment"])
        return rec.get("uid", self.uid) == self.uid and rec["name"].startswith(prefix) \
            and (instance is None or (tag is not None and tag.instance == instance))

    def list_allocations(self, prefix: str = NAME_PREFIX, *,
                         instance: str | None = None) -> tuple[Allocation, ...]:
        with self._state() as state:
            allocs = dict(state["allocations"])
        return tuple(self._to_allocation(a, rec) for a, rec in sorted(allocs.items(),
                                                                      key=lambda kv: int(kv[0]))
                     if self._owned(rec, prefix, instance))

    def release(self, alloc_id: str) -> None:
        """End the allocation's steps and forget it; an unknown id is not an error."""
        with self._state() as state:
            rec = state["allocations"].pop(alloc_id, None)
        if rec is None:
            return
        for name, step in rec["steps"].items():
            self._terminate(step["tasks"])
            if (alloc_id, name) in self._launched:
                self._launched[(alloc_id, name)].cancelled = True
        for key in [k for k in self._launched if k[0] == alloc_id]:   # no <defunct> left
            for proc in self._launched[key].procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)

    def shrink(self, alloc_id: str, keep: Sequence[str]) -> None:
        """Give back every node of the allocation but ``keep``: their GPUs and CPUs are
        free again and its steps' tasks on them are ended (SIGTERM, then SIGKILL), the
        others go on, as under Slurm's ``scontrol update JobId=X NodeList=...``."""
        doomed: list[list[int]] = []
        with self._state() as state:
            rec = self._alloc(state, alloc_id)
            if not any(n in keep for c in rec["components"] for n in c["nodes"]):
                raise ConfigError(f"shrink of allocation {alloc_id} to {list(keep)}: keep at "
                                  "least one of its nodes")
            for comp in rec["components"]:
                comp["nodes"] = [n for n in comp["nodes"] if n in keep]
                comp["gpus"] = {n: g for n, g in comp["gpus"].items() if n in keep}
            for step in rec["steps"].values():
                on = _spread(step["ntasks"], step["nodes"])
                doomed += [t for t, n in zip(step["tasks"], on, strict=False) if n not in keep]
        self._terminate(doomed)
        log.info("local allocation %s shrunk to %s", alloc_id, ",".join(keep))

    def nodes(self) -> tuple[NodeInfo, ...]:
        with self._state() as state:
            usage = self._usage(state)
        out = []
        for pool in self.layout.pools:
            for node in pool.node_names():
                used = len(usage.gpus.get(node, ())) + usage.cpus.get(node, 0)
                full = usage.cpus.get(node, 0) >= pool.cpus_per_node or \
                    len(usage.gpus.get(node, ())) >= pool.gpus_per_node > 0
                st = "allocated" if full else ("mixed" if used else "idle")
                out.append(NodeInfo(node, (pool.partition,), st, pool.cpus_per_node,
                                    pool.gpu_type, pool.gpus_per_node, "127.0.0.1"))
        return tuple(out)

    # -- steps -------------------------------------------------------------------------

    def _alloc(self, state: State, alloc_id: str) -> State:
        try:
            return dict(state["allocations"][alloc_id])
        except KeyError:
            raise StateError(f"local backend: allocation {alloc_id!r} does not exist; known: "
                             f"{sorted(state['allocations'])}") from None

    def _place(self, rec: State, spec: StepSpec) -> tuple[State, list[str]]:
        comps = rec["components"]
        group = spec.het_group or 0
        if not 0 <= group < len(comps):
            raise InfeasibleRequest(f"step {spec.name!r}: het_group={spec.het_group} but the "
                                    f"allocation has {len(comps)} component(s)")
        comp = comps[group]
        if spec.nodelist:
            bad = [n for n in spec.nodelist if n not in comp["nodes"]]
            if bad:
                raise InfeasibleRequest(f"step {spec.name!r}: nodelist {bad} not in the "
                                        f"allocation's nodes {comp['nodes']}")
            nodes = list(spec.nodelist)
        else:
            nodes = comp["nodes"][:spec.node_count or min(spec.ntasks, len(comp["nodes"]))]
        if spec.node_count is not None and spec.node_count > len(nodes):
            raise InfeasibleRequest(f"step {spec.name!r}: node_count={spec.node_count} but "
                                    f"only {len(nodes)} node(s) available: {nodes}")
        return comp, nodes[:spec.node_count] if spec.node_count else nodes

    @staticmethod
    def _step_gpus(comp: State, nodes: list[str], spec: StepSpec) -> dict[str, list[int]]:
        """The GPUs each node's tasks see: the first ``gpus_per_node`` of the allocation's.

        As in Slurm 22.05, ``--overlap`` steps share GRES: two running steps asking
        for 4 GPUs each both get the same first 4 (the executor time-multiplexes them).
        """
        if not spec.gpus_per_node:
            return {n: list(comp["gpus"][n]) for n in nodes}
        if spec.gpus_per_node > comp["gpus_per_node"]:
            raise InfeasibleRequest(f"step {spec.name!r}: gpus_per_node={spec.gpus_per_node} "
                                    f"but the allocation holds {comp['gpus_per_node']} per node")
        return {n: list(comp["gpus"][n][:spec.gpus_per_node]) for n in nodes}

    def launch_step(self, alloc_id: str, spec: StepSpec) -> StepHandle:
        procs = self._start_step(alloc_id, spec, piped=False)
        return StepHandle(alloc_id, spec.name, procs[0].pid)

    def open_step(self, alloc_id: str, spec: StepSpec) -> PipedProcess:
        if spec.ntasks != 1:
            raise ConfigError(f"step {spec.name!r}: a piped step has one task, got "
                              f"ntasks={spec.ntasks}")
        return self._start_step(alloc_id, spec, piped=True)[0]

    def _start_step(self, alloc_id: str, spec: StepSpec,
                    piped: bool) -> list[subprocess.Popen[bytes]]:
        spec.validate()
        # Record the step before starting its tasks, each tagged in its environment, so
        # a process killed in between leaves tasks that the next state load finds by
        # their tag (see _adopt_launching) instead of orphans nobody will stop.
        with self._state() as state:
            rec = self._alloc(state, alloc_id)
            if spec.name in rec["steps"]:
                raise StateError(f"step {spec.name!r} already runs in allocation {alloc_id}; "
                                 "step names must be unique while running")
            comp, nodes = self._place(rec, spec)
            gpus = self._step_gpus(comp, nodes, spec)
            step_no = rec["next_step"]
            tag = f"{self._path}:{alloc_id}.{step_no}"
            live = state["allocations"][alloc_id]
            live["next_step"] = step_no + 1
            live["steps"][spec.name] = {
                "step_id": f"{alloc_id}.{step_no}", "nodes": nodes, "ntasks": spec.ntasks,
                "gpus": gpus, "tasks": [], "tag": tag, "launching_since": time.time()}
        task_nodes = _spread(spec.ntasks, nodes)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(spec.ntasks):
                procs.append(self._spawn_task(alloc_id, step_no, spec, task_nodes, rank, gpus,
                                              tag, piped))
        finally:
            with self._state() as state:
                step = state["allocations"].get(alloc_id, {}).get("steps", {}).get(spec.name)
                if step is not None and procs:
                    step["tasks"] = [[p.pid, daemons.start_ticks(p.pid) or 0] for p in procs]
                    step.pop("launching_since", None)
        self._launched[(alloc_id, spec.name)] = _Launched(procs)
        return procs

    def _spawn_task(self, alloc_id: str, step_no: int, spec: StepSpec, task_nodes: list[str],
                    rank: int, gpus: dict[str, list[int]], tag: str,
                    piped: bool = False) -> subprocess.Popen[bytes]:
        node = task_nodes[rank]
        nodes = list(dict.fromkeys(task_nodes))
        visible = ",".join(str(i) for i in gpus[node])
        env = {**os.environ, **spec.env,
               "SLURM_JOB_ID": alloc_id, "SLURM_JOBID": alloc_id,
               "SLURM_STEP_ID": str(step_no), "SLURM_STEPID": str(step_no),
               "SLURM_JOB_NAME": spec.name, "SLURM_PROCID": str(rank),
               "SLURM_LOCALID": str(task_nodes[:rank].count(node)),
               "SLURM_NODEID": str(nodes.index(node)), "SLURM_NTASKS": str(spec.ntasks),
               "SLURM_NNODES": str(len(nodes)), "SLURM_STEP_NODELIST": ",".join(nodes),
               "SLURM_CPUS_PER_TASK": str(spec.cpus_per_task), "SLURMD_NODENAME": node,
               "CUDA_VISIBLE_DEVICES": visible, "SLURM_STEP_GPUS": visible,
               "WEAVE_BACKEND": self.kind, STEP_TAG_ENV: tag,
               # where the task's allocation watch sees it held (slurm/allocation_watch.py)
               LOCAL_STATE_ENV: str(self._path.resolve())}
        sink: Any = subprocess.DEVNULL
        if spec.log_path is not None:
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            sink = open(spec.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            if piped:   # stdin/stdout are the caller's; stderr to the log
                return subprocess.Popen(list(spec.argv), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=sink, env=env,
                                        start_new_session=True)
            return subprocess.Popen(list(spec.argv), stdin=subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as exc:
            raise StateError(f"step {spec.name!r}: cannot start {spec.argv[0]!r}: {exc}") \
                from exc
        finally:
            if sink is not subprocess.DEVNULL:
                sink.close()

    def list_steps(self, alloc_id: str) -> tuple[StepInfo, ...]:
        with self._state() as state:
            rec = state["allocations"].get(alloc_id, {"steps": {}})
            steps = dict(rec["steps"])
        return tuple(StepInfo(alloc_id, s["step_id"], name, tuple(s["nodes"]), s["ntasks"])
                     for name, s in sorted(steps.items(), key=lambda kv: kv[1]["step_id"]))

    def poll_step(self, handle: StepHandle) -> StepStatus:
        launched = self._launched.get((handle.alloc_id, handle.name))
        if launched is None:  # started by an earlier process: only liveness is known
            running = any(s.name == handle.name for s in self.list_steps(handle.alloc_id))
            return StepStatus(StepState.RUNNING if running else StepState.UNKNOWN)
        codes = [p.poll() for p in launched.procs]
        if any(c is None for c in codes):
            return StepStatus(StepState.RUNNING)
        rc = next((c for c in codes if c), 0)
        if rc and not launched.cancelled:  # released by another process (e.g. after restart)?
            with self._state() as state:
                launched.cancelled = handle.alloc_id not in state["allocations"]
        if launched.cancelled:
            return StepStatus(StepState.CANCELLED, rc)
        return StepStatus(StepState.COMPLETED if rc == 0 else StepState.FAILED, rc)

    def cancel_step(self, handle: StepHandle, timeout_s: float = 10.0) -> None:
        with self._state() as state:
            rec = state["allocations"].get(handle.alloc_id, {"steps": {}})
            step = rec["steps"].pop(handle.name, None)
        launched = self._launched.get((handle.alloc_id, handle.name))
        if launched is not None:
            launched.cancelled = True
        if step is not None:
            self._terminate(step["tasks"], timeout_s)
        if launched is not None:
            for p in launched.procs:
                p.wait(timeout=timeout_s)

    @staticmethod
    def _terminate(tasks: list[list[int]], timeout_s: float = 10.0) -> None:
        """SIGTERM each task's process group, SIGKILL what is left after ``timeout_s``."""
        live = [(pid, ticks) for pid, ticks in tasks if daemons.process_alive(pid, ticks)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid, _ in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                live = [(p, t) for p, t in live if daemons.process_alive(p, t)]
                if not live:
                    return
                time.sleep(0.02)


#: Environment variable carrying a local step's tag into each of its tasks.
STEP_TAG_ENV = "WEAVE_LOCAL_STEP"
#: How long a launch may stay unconfirmed before its record is dropped.
LAUNCH_GRACE_S = 30.0


def _adopt_launching(step: dict[str, Any]) -> None:
    """Find the tasks of a launch that was interrupted, by the tag in their environment."""
    needle = f"{STEP_TAG_ENV}={step['tag']}".encode() + b"\0"
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env + b"\0":
            pid = int(entry.name)
            found.append([pid, daemons.start_ticks(pid) or 0])
    if found:
        step["tasks"] = sorted(found)
        step.pop("launching_since", None)
    elif time.time() - float(step["launching_since"]) > LAUNCH_GRACE_S:
        step.pop("launching_since", None)  # nothing started: _prune forgets the record
