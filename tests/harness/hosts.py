"""A Slurm cluster whose nodes are separate hosts, for the tests (every `slurm` test).

Each node is its own network, mount and hostname namespace (``weave cluster up --hosts
separate``); only the cluster's shared file systems are common. The subnet is a free
/24 of 10.214.0.0/16 (no route of this host overlaps it), so two such clusters of
different test sessions do not clash. What a test looks at on a node (its /dev/shm,
its node daemons' sockets) it looks at on that node's host (:func:`on_host`,
:func:`node_status`); worker pids are the machine's (no pid namespace per host), so
a worker is killed by pid from the login side.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.waits import settle, wait_for
from weave_slurm.errors import ConfigError, WeaveError
from weave_slurm.slurm import hosts as separate_hosts
from weave_slurm.slurm.cluster_config import ClusterLayout, HostMode, PoolShape
from weave_slurm.slurm.command_runner import CommandResult, SubprocessRunner, run_command
from weave_slurm.slurm.host_plan import NODE_IFNAME
from weave_slurm.slurm.local_cluster import ClusterStatus, LocalCluster

TOOLS = ("slurmd", "ip", "tc", "nsenter", "unshare", "setpriv", "munged")
#: Two h20 and two h800 hosts of 8 (fake) GPUs, as the job specs in configs/jobs ask.
LAYOUT = ClusterLayout((PoolShape("h20", "h20", 2, gpus_per_node=8, cpus_per_node=8),
                        PoolShape("h800", "h800", 2, gpus_per_node=8, cpus_per_node=8)))
#: Where a weaved instance's node daemons keep warm state and sockets on each host
#: (weaved's defaults on Slurm): ``<root>/<instance>/<node>``, ``<dir>/<instance>/``.
SHM_ROOT = Path("/dev/shm/weave-nodes")
SOCKET_ROOT = Path("/run/weave")


def skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("separate hosts need root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"separate hosts need {', '.join(missing)}")


def free_subnet() -> str:
    """A /24 of 10.214.0.0/16 that no route of this host overlaps (other clusters'),
    from one that depends on the session (two sessions rarely start on the same)."""
    try:
        return separate_hosts.free_subnet(SubprocessRunner(),
                                          f"10.214.{100 + os.getpid() % 100}.0/24")
    except ConfigError:
        pytest.skip("no free /24 in 10.214.0.0/16")


def bring_up(cluster: LocalCluster, layout: ClusterLayout = LAYOUT,
             **kw: Any) -> ClusterStatus:
    """``up`` with separate hosts on a free subnet (again with another one if a cluster
    of another session took it meanwhile)."""
    skip_unless_possible()
    for attempt in range(3):
        try:
            return cluster.up(layout, hosts=HostMode.SEPARATE, subnet=free_subnet(),
                              timeout_s=60, **kw)
        except ConfigError as exc:
            if "--subnet" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


@contextmanager
def hosts_cluster(state: Path, layout: ClusterLayout = LAYOUT,
                  interpool_gbps: float | None = None) -> Iterator[LocalCluster]:
    """A separate-hosts cluster in ``state``, brought down (everything in it) at the end."""
    cluster = LocalCluster(state)
    try:
        bring_up(cluster, layout, interpool_gbps=interpool_gbps)
        yield cluster
    finally:
        cluster.down()


def on_host(cluster: LocalCluster, node: str, argv: list[str]) -> str:
    """Run ``argv`` on ``node``'s host (in its namespaces); its stdout."""
    return run_command(cluster.host_argv(node, argv), timeout_s=60).stdout


def run_on_host(cluster: LocalCluster, node: str, argv: list[str],
                timeout_s: float = 60) -> CommandResult:
    """:func:`on_host` that returns the result whatever the exit code."""
    return run_command(cluster.host_argv(node, argv), timeout_s=timeout_s, check=False)


def node_names(cluster: LocalCluster) -> tuple[str, ...]:
    plan = cluster.hosts_plan()
    assert plan is not None, "not a separate-hosts cluster"
    return tuple(n.name for n in plan.nodes)


# -- what weaved's node daemons keep on a host --------------------------------------


@dataclass(frozen=True)
class WeavedDirs:
    """Where one weaved of a test keeps its state (login side only: no node sees it)
    and its checkpoints: the cluster's shared checkpoint root, in which its node
    daemons keep theirs under ``<root>/<instance>/<node>``."""

    state: Path
    ckpt: Path
    instance: str

    @property
    def node_ckpt(self) -> Path:
        """This instance's part of the checkpoint root: what its node daemons' command
        lines name (weaved's own does not), the marker of ``daemons_gone``."""
        return self.ckpt / self.instance if self.instance else self.ckpt


def weaved_dirs(cluster: LocalCluster, instance: str) -> WeavedDirs:
    return WeavedDirs(cluster.paths.login_dir / (instance or "weaved"),
                      cluster.shared_paths().ckpt, instance)


def node_socket(instance: str, node: str) -> Path:
    """The node-local socket of ``instance``'s node daemon on ``node`` (on its host)."""
    return SOCKET_ROOT / instance / f"node-{node}.sock" if instance else \
        SOCKET_ROOT / f"node-{node}.sock"


def node_shm(instance: str, node: str) -> Path:
    """The warm-state root of ``instance``'s node daemon on ``node`` (on its host)."""
    return SHM_ROOT / instance / node if instance else SHM_ROOT / node


#: ``status(sock)``: one ``status`` request to a node daemon's local socket, its reply
#: (stdlib only: a torch import per poll would cost seconds on a loaded machine).
_STATUS_FN = """\
import json, os, signal, socket, sys, time
def status(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    s.sendall(b'{"op": "status"}\\n')
    buf = b''
    while not buf.endswith(b'\\n'):
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    s.close()
    return json.loads(buf)
"""
_STATUS = _STATUS_FN + "print(json.dumps(status(sys.argv[1])))\n"
#: On the node's host: poll the node daemon until ``job``'s worker runs a phase (argv 5:
#: that phase, or any), SIGKILL it at once (argv 6: unless "watch") and print {"pid",
#: "phase", "job"} and, after a kill, "outcome": the state the daemon then gives that
#: activation ("killed": it landed mid-phase; "exited": the phase had ended first), or
#: "replaced" (a newer activation came first) or null (none seen in 30 s); exit 1 if
#: none ran within the timeout.
_KILL_RUNNING = _STATUS_FN + """\
sock, job, end = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
engine, phase, kill = sys.argv[4] == "engine", sys.argv[5], sys.argv[6] != "watch"
def jobs():
    try:
        return status(sock)["result"]["jobs"]
    except (OSError, ValueError, KeyError):
        return []
def outcome(ref, pid):
    end = time.monotonic() + 30
    while time.monotonic() < end:
        for j in jobs():
            act = j.get("worker") or {}
            if str(j["job"]) == ref and act.get("pid") != pid:
                return "replaced"
            if str(j["job"]) == ref and act.get("state") != "running":
                return act.get("state")
        time.sleep(0.01)
    return None
while time.monotonic() < end:
    for j in jobs():
        act = j.get("worker") or {}
        ref = str(j["job"])
        if (ref == job or ref.startswith(job + ".e") and engine) \
                and act.get("state") == "running" and act.get("pid") \
                and phase in ("", act.get("phase")):
            out = {"pid": int(act["pid"]), "phase": act.get("phase"), "job": ref}
            if kill:
                os.kill(out["pid"], signal.SIGKILL)
                out["outcome"] = outcome(ref, act["pid"])
            print(json.dumps(out))
            sys.exit(0)
    time.sleep(0.01)
sys.exit(1)
"""


def kill_running_worker(cluster: LocalCluster, node: str, instance: str, job: int,
                        timeout_s: float = 60, *, key: str | None = None,
                        engine: bool = False, phase: str = "",
                        watch: bool = False) -> dict[str, Any] | None:
    """SIGKILL ``job``'s worker on ``node`` while it runs a phase (``phase``, or any),
    from the node's own host (the status read and the kill a few ms apart, as an admin
    there would); {"pid", "phase"} of the killed worker, or None if none ran within
    ``timeout_s``. ``key``: the node daemon's (a share's ``<node>.<job id>``; default
    ``node``); ``engine``: one of the job's rollout engines (``<job>.e<e>``) will do;
    ``watch``: only return once it runs, no kill. After a kill, its "outcome" as the
    daemon tells it (``_KILL_RUNNING``)."""
    res = run_on_host(cluster, node, [sys.executable, "-c", _KILL_RUNNING,
                                      str(node_socket(instance, key or node)), str(job),
                                      str(timeout_s), "engine" if engine else "worker",
                                      phase, "watch" if watch else "kill"],
                      timeout_s=timeout_s + 60)
    if res.returncode != 0:
        return None
    killed: dict[str, Any] = json.loads(res.stdout)
    return killed


def kill_until_recovered(kill: Callable[[], dict[str, Any] | None],
                         recoveries: Callable[[], int], tries: int = 4,
                         recover_s: float = 240) -> dict[str, Any]:
    """``kill`` (one :func:`kill_running_worker`) until a kill lands mid-phase, then wait
    for the job to count its recovery (``recover_s``: a killed engine is found once its
    gang's peers give up on it, later on a loaded machine). The status read and the
    kill are a few ms apart, but a short phase may still end in between: the daemon
    then says the activation "exited" and replaces the idle worker silently, nothing
    to recover, and the next try kills again. The kill that landed; AssertionError
    after ``tries`` misses, or when a landed kill is never recovered."""
    seen: list[dict[str, Any] | None] = []
    for _ in range(tries):
        killed = kill()
        seen.append(killed)
        if killed is None or killed.get("outcome") in ("exited", "replaced"):
            if settle(recoveries, 5, interval_s=0.3, until=lambda n: n >= 1):
                return killed or {}
            continue
        wait_for(recoveries, recover_s, f"a recovery after the kill {killed}",
                 interval_s=0.5, until=lambda n: n >= 1)
        return killed
    raise AssertionError(f"no kill landed mid-phase in {tries} tries: {seen}")


def node_status(cluster: LocalCluster, node: str, instance: str) -> dict[str, Any] | None:
    """The ``status`` reply of ``instance``'s node daemon on ``node``, asked on its host
    over the node-local socket; None if none answers there."""
    try:
        res = run_on_host(cluster, node, [sys.executable, "-c", _STATUS,
                                          str(node_socket(instance, node))], timeout_s=30)
        reply = json.loads(res.stdout) if res.returncode == 0 else None
    except (WeaveError, ValueError):
        return None
    if not isinstance(reply, dict) or not reply.get("ok"):
        return None
    result: dict[str, Any] = reply["result"]
    return result


def shm_paths(cluster: LocalCluster, node: str, root: Path) -> list[str]:
    """Every path under ``root`` on ``node``'s host (none if it does not exist there)."""
    out = run_on_host(cluster, node, ["find", str(root), "-mindepth", "1"]).stdout
    return [line for line in out.splitlines() if line.strip()]


def naming_jobs(paths: list[str], jobs: Iterable[object]) -> list[str]:
    """The paths one of whose components is one of ``jobs`` (ids, as a job's segments
    and checkpoints are named)."""
    names = {str(j) for j in jobs}
    return [q for q in paths if names & set(Path(q).parts)]


def link_down(cluster: LocalCluster, node: str) -> None:
    """Take ``node``'s network interface down: the host drops off the network (Slurm,
    weaved and the other nodes reach it no more); its processes keep running."""
    on_host(cluster, node, ["ip", "link", "set", NODE_IFNAME, "down"])


def link_up(cluster: LocalCluster, node: str) -> None:
    on_host(cluster, node, ["ip", "link", "set", NODE_IFNAME, "up"])
