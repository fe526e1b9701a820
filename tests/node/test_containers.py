"""node/containers.py: the launch bundle a role's process runs in (the job bundle's
config.json with the role's process, the job's ids and the node's bind mounts), the
runtime's argv from oci.conf, and a node daemon running a role in a real container with
runc (no Slurm): it ran inside, and a drop ends it and deletes the container. On the
Slurm cluster: tests/daemon/test_container_slurm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.harness.oci_bundle import MARKER, MARKER_TEXT, make_bundle
from tests.harness.processes import pid_alive
from tests.harness.waits import wait_for
from weave_slurm.config.oci import parse_oci_conf
from weave_slurm.errors import ConfigError
from weave_slurm.node import containers, zygotes
from weave_slurm.node.index import JobRef
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.slurm.cluster_config import render_oci_conf
from weave_slurm.slurm.local_cluster import oci_runtime

BUNDLE_CONFIG = {
    "ociVersion": "1.0.2", "root": {"path": "elsewhere", "readonly": True},
    "process": {"terminal": True, "args": ["sh"], "cwd": "/", "noNewPrivileges": True},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}],
    "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]},
}


def _bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "bin").mkdir(parents=True)
    (bundle / "rootfs" / "bin" / "bash").touch()
    (bundle / "config.json").write_text(json.dumps(BUNDLE_CONFIG))
    return bundle


def test_the_launch_bundle_runs_the_role_as_the_job_with_the_nodes_binds(tmp_path: Path) -> None:
    bundle, work, sock = _bundle(tmp_path), tmp_path / "work", tmp_path / "sock"
    work.mkdir()
    sock.mkdir()
    conf = parse_oci_conf('RunTimeRun="runc run --bundle %b %n.%u.%j.%s.%t"\n'
                          'RunTimeDelete="runc delete --force %n.%u.%j.%s.%t"\n',
                          tmp_path / "oci.conf")
    launch = containers.prepare(
        conf, str(bundle), tmp_path / "launch",
        args=containers.shell_args(str(bundle), "python3.11 job.py"),
        env={"A": "1", "PYTHONPATH": str(tmp_path)}, workdir=str(work), uid=1000, gid=100,
        groups=[100, 27], socket_dir=str(sock),
        names={"n": "h20-0", "u": "alice", "j": "7", "s": "weave3", "t": "train/x"})
    assert launch.argv == ["runc", "run", "--bundle", str(tmp_path / "launch"),
                           "h20-0.alice.7.weave3.train_x"]
    assert launch.delete == ["runc", "delete", "--force", "h20-0.alice.7.weave3.train_x"]
    config = json.loads((tmp_path / "launch" / "config.json").read_text())
    assert config["root"] == {"path": str(bundle / "rootfs"), "readonly": True}
    process = config["process"]
    assert process["args"] == ["/bin/bash", "-c", "python3.11 job.py"]
    assert process["terminal"] is False and process["cwd"] == str(work)
    assert process["noNewPrivileges"] is True                     # the bundle's own, kept
    assert process["user"] == {"uid": 1000, "gid": 100, "additionalGids": [27]}
    env = dict(e.split("=", 1) for e in process["env"])
    path = env["PYTHONPATH"].split(":")
    assert env["A"] == "1" and path[0] == str(tmp_path)
    assert set(containers.weave_import_path()) <= set(path)       # weave's own, after
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts["/proc"]["type"] == "proc"                      # the bundle's, kept
    assert mounts["/dev/shm"] == {"destination": "/dev/shm", "type": "bind",
                                  "source": "/dev/shm", "options": ["rbind", "rw"]}
    assert mounts[str(sock)]["options"] == ["rbind", "rw"]        # the gate's socket
    assert mounts[str(work)]["options"] == ["rbind", "rw"]
    weave_pkg = str(Path(containers.__file__).parents[2])
    assert any(weave_pkg.startswith(d) and m["options"][1] == "ro"
               for d, m in mounts.items()), sorted(mounts)
    assert "/" not in mounts


def test_weave_import_path_leaves_out_the_standard_library() -> None:
    ours = containers.weave_import_path()
    assert ours and all(not p.startswith(sys.base_prefix) for p in ours)
    assert "/" not in ours


def test_binds_are_each_once_parents_first(tmp_path: Path) -> None:
    sock, out = tmp_path / "s" / "i", tmp_path / "out"
    sock.mkdir(parents=True)
    out.mkdir()
    got = containers.binds(socket_dir=str(sock), workdir=str(tmp_path),
                           pythonpath=[str(tmp_path), "/", "relative", str(tmp_path / "no")],
                           import_path=["/usr/lib"], writable=[str(out)])
    assert [(b.path, b.writable) for b in got] == [
        ("/dev/shm", True), ("/usr/lib", False), (str(tmp_path), True), (str(out), True),
        (str(sock), True)]


def test_a_bundle_without_config_is_refused_at_launch(tmp_path: Path) -> None:
    conf = parse_oci_conf('RunTimeRun="runc run --bundle %b x"\n', tmp_path / "oci.conf")
    (tmp_path / "b" / "rootfs").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"container '.*/b': has no config.json"):
        containers.prepare(conf, str(tmp_path / "b"), tmp_path / "l", args=["true"], env={},
                           workdir="/", uid=0, gid=0, groups=[], socket_dir="/run/w",
                           names={})
    with pytest.raises(ConfigError, match=r"configures no OCI runtime"):
        containers.prepare(parse_oci_conf("", tmp_path / "oci.conf"), str(tmp_path / "b"),
                           tmp_path / "l", args=["true"], env={}, workdir="/", uid=0, gid=0,
                           groups=[], socket_dir="/run/w", names={})


def _oci(tmp_path: Path) -> tuple[str, Path, Path]:
    """An OCI runtime (the test skips without one), a bundle, and an oci.conf in
    ``tmp_path`` whose runtime state is under ``tmp_path``: (runtime, bundle, state)."""
    runtime = oci_runtime()
    if runtime is None:
        pytest.skip("no OCI runtime (runc, crun) installed")
    bundle = make_bundle(tmp_path / "bundle")
    state = tmp_path / "runtime-state"
    (tmp_path / "oci.conf").write_text(render_oci_conf(runtime).replace("/run/weave-oci",
                                                                        str(state)))
    return runtime, bundle, state


def _call(sock: Path, op: Op, **args: Any) -> dict[str, Any]:
    with NodeClient(sock) as client:
        return client.call(op, **args)


@pytest.mark.skipif(os.geteuid() != 0, reason="the OCI runtime runs as root")
def test_a_role_runs_in_its_container_and_a_drop_ends_and_deletes_it(node: Any,
                                                                     tmp_path: Path) -> None:
    runtime, bundle, state = _oci(tmp_path)
    out = tmp_path / "out.txt"
    sock = node.config.socket
    with mock.patch.dict(os.environ, {"SLURM_CONF": str(tmp_path / "slurm.conf")}):
        _call(sock, Op.REGISTER, job="k1")
        pid = _call(sock, Op.LAUNCH, job="k1", action="start", role="train",
                    command=f"cat {MARKER}; readlink /proc/self/ns/mnt; sleep 60",
                    container=str(bundle), workdir=str(tmp_path), output=str(out))["pid"]
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 2, 30,
                 f"the contained process's output in {out}")
        marker, mntns = out.read_text().splitlines()[:2]
        assert marker == MARKER_TEXT
        assert mntns != os.readlink("/proc/self/ns/mnt")
        listed = _listed(runtime, state)
        assert listed == [f"{os.uname().nodename}.root.0.weavek1.train"], listed
        with pytest.raises(ConfigError, match=r"cannot open its rollout output file"):
            _call(sock, Op.LAUNCH, job="k1", action="start", role="rollout", command="true",
                  container=str(bundle), output=str(tmp_path / "no" / "such" / "out"))
        job_dir = node.store.job_dir(JobRef("k1", os.geteuid()))
        assert not (job_dir / "oci-rollout").exists()     # its launch bundle went with it
        _call(sock, Op.DROP, job="k1")
        wait_for(lambda: not pid_alive(pid), 15, f"launcher {pid} gone after the drop")
        wait_for(lambda: not _listed(runtime, state), 15, "the container deleted (RunTimeDelete)")


ENTRY = """
import os, sys, torch

def where(ctx):
    with open("/etc/weave-container-marker") as f:
        marker = f.read().strip()
    return {"marker": marker, "mntns": os.readlink("/proc/self/ns/mnt"), "pid": os.getpid(),
            "executable": sys.executable, "version": sys.version.split()[0],
            "torch": torch.__version__}
"""


@pytest.mark.torch
@pytest.mark.skipif(os.geteuid() != 0, reason="the OCI runtime runs as root")
def test_a_hosted_jobs_worker_runs_in_its_container(resident_node: Any,
                                                    tmp_path: Path) -> None:
    """Its zygote starts in the bundle (the image's python3.11 importing torch from the
    node's venv, bound in read-only), forks its worker there; the pool sees its pid."""
    runtime, bundle, state = _oci(tmp_path)
    code = tmp_path / "code"
    code.mkdir()
    (code / "entry.py").write_text(ENTRY)
    sock = resident_node.config.socket
    with mock.patch.dict(os.environ, {"SLURM_CONF": str(tmp_path / "slurm.conf")}):
        _call(sock, Op.REGISTER, job="h1")
        reply = _call(sock, Op.ACTIVATE, job="h1", phase="train",
                      entry=f"{code / 'entry.py'}:where", pythonpath=[str(code)],
                      workdir=str(code), container=str(bundle))
        assert reply["resident"], reply
        done = wait_for(lambda: _call(sock, Op.PHASE, job="h1")["worker"], 120,
                        "h1's phase in its container", interval_s=0.05,
                        until=lambda w: w["state"] != "running")
        assert done["state"] == "exited", done
        got = done["result"]
        assert got["marker"] == MARKER_TEXT
        assert got["mntns"] != os.readlink("/proc/self/ns/mnt")
        assert got["executable"] == "/usr/bin/python3.11" and got["version"] == "3.11.2"
        assert got["torch"] == __import__("torch").__version__
        assert pid_alive(got["pid"])            # the host's pid: the pool tracks it
        _call(sock, Op.DROP, job="h1")
        # no job needs its zygote any more: it is retired, its container deleted
        wait_for(lambda: not _listed(runtime, state), 30, "the zygote's container deleted",
                 ignore=(subprocess.CalledProcessError,))   # runc list mid-delete: not yet
        assert not pid_alive(got["pid"])


@pytest.mark.skipif(os.geteuid() != 0, reason="the OCI runtime runs as root")
def test_an_interpreter_the_image_lacks_fails_the_phase_at_once(resident_node: Any,
                                                                tmp_path: Path) -> None:
    _, bundle, _ = _oci(tmp_path)
    sock = resident_node.config.socket
    with mock.patch.dict(os.environ, {"SLURM_CONF": str(tmp_path / "slurm.conf")}):
        _call(sock, Op.REGISTER, job="h2")
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r"no worker with its python: /opt/none/python3 "
                                              r"in container .*/bundle .*exited .*before it was "
                                              r"ready: .*/opt/none/python3: no such file"):
            _call(sock, Op.ACTIVATE, job="h2", phase="train", entry="os:getpid",
                  python="/opt/none/python3", container=str(bundle))
        assert time.monotonic() - start < zygotes.CONNECT_TIMEOUT_S / 2


def _listed(runtime: str, state: Path) -> list[str]:
    return subprocess.run([runtime, f"--root={state}", "list", "-q"], check=True,
                          capture_output=True, text=True).stdout.split()
