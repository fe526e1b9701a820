"""The weave SPANK plugin, built with make and loaded into the session's Slurm cluster: by
the clients on the login side (options) and by slurmstepd on each node's host (tasks),
from the site dir every host reads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness.hosts import on_host
from tests.slurm.session_cluster import SPANK_SRC, SessionCluster, build_spank
from weave_slurm.slurm.command_runner import run_command

pytestmark = pytest.mark.slurm


def _run(sc: SessionCluster, *argv: str) -> tuple[int, str]:
    res = run_command(list(argv), env=sc.env, timeout_s=60, check=False)
    return res.returncode, res.stdout + res.stderr


def test_make_builds_a_shared_object(tmp_path: Path) -> None:
    so = build_spank(tmp_path)
    assert so.read_bytes()[:4] == b"\x7fELF"
    syms = run_command(["nm", "-D", "--defined-only", str(so)]).stdout
    for sym in ("slurm_spank_init", "slurm_spank_task_init", "plugin_name"):
        assert sym in syms
    assert (SPANK_SRC / "weave.c").stat().st_mtime <= so.stat().st_mtime


@pytest.mark.parametrize("tool", ["sbatch", "salloc", "srun"])
def test_options_show_in_help(slurm_cluster: SessionCluster, tool: str) -> None:
    rc, out = _run(slurm_cluster, tool, "--help")
    assert rc == 0
    for opt in ("--weave-slo=SLO", "--weave-group=ID", "--weave-spec=PATH"):
        assert opt in out, f"{opt} missing from {tool} --help"


@pytest.mark.parametrize(("flag", "message"), [
    ("--weave-slo=0.5", "weave: --weave-slo='0.5' is below 1.0"),
    ("--weave-slo=abc", "weave: --weave-slo='abc' is not a number"),
    ("--weave-slo=nan", "weave: --weave-slo='nan' is not a number"),
    ("--weave-group=a b", "weave: --weave-group='a b' is not a group id"),
    ("--weave-spec=/no/such/spec.toml", "weave: --weave-spec='/no/such/spec.toml' cannot be "
                                        "read"),
])
def test_bad_values_are_refused(slurm_cluster: SessionCluster, flag: str, message: str) -> None:
    rc, out = _run(slurm_cluster, "srun", "-p", "h20", "-n1", flag, "true")
    assert rc != 0
    assert message in out
    rc, out = _run(slurm_cluster, "sbatch", flag, "-p", "h20", "--wrap=true")
    assert rc != 0 and message in out


def test_values_reach_the_step_env_and_node_socket_is_set(slurm_cluster: SessionCluster,
                                                          shared_tmp: Path) -> None:
    for node in ("h20-0", "h20-1"):   # the .so plugstack.conf names, on the node's host
        assert on_host(slurm_cluster.cluster, node, ["head", "-c4", str(
            slurm_cluster.spank_plugin)]) == "\x7fELF"
    spec = shared_tmp / "job.toml"   # the users' shared file system
    spec.write_text("[job]\n")
    rc, out = _run(slurm_cluster, "srun", "-p", "h20", "-N2", "-n2", "--weave-slo=1.5",
                   "--weave-group=g7", f"--weave-spec={spec}", "sh", "-c",
                   "echo $SLURMD_NODENAME $WEAVE_SLO $WEAVE_GROUP $WEAVE_SPEC "
                   "$WEAVE_NODE_SOCKET")
    assert rc == 0, out
    sock = slurm_cluster.socket_dir
    assert sorted(out.split("\n")[:2]) == [
        f"h20-0 1.5 g7 {spec} {sock}/node-h20-0.sock",
        f"h20-1 1.5 g7 {spec} {sock}/node-h20-1.sock"]


def test_sbatch_value_reaches_the_batch_job(slurm_cluster: SessionCluster,
                                            shared_tmp: Path) -> None:
    out = shared_tmp / "job.out"   # slurmstepd writes it on the node's host
    rc, text = _run(slurm_cluster, "sbatch", "--weave-slo=2.25", "--weave-group=g9", "-p",
                    "h800", f"--output={out}",
                    "--wrap=echo SLO=$WEAVE_SLO GROUP=$WEAVE_GROUP; "
                    "srun -n1 sh -c 'echo STEP=$WEAVE_NODE_SOCKET'")
    assert rc == 0, text
    deadline = time.monotonic() + 30
    while "STEP=" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, "batch job did not write its output"
        time.sleep(0.1)
    lines = out.read_text().splitlines()
    assert lines[0] == "SLO=2.25 GROUP=g9"
    assert lines[1].startswith(f"STEP={slurm_cluster.socket_dir}/node-h800-")
