"""Jobs in a container on the session's Slurm cluster (separate hosts).

``srun --container`` runs a step in the test bundle (Slurm's own path, with the
cluster's oci.conf; the bundle: Debian's python3.11 rootfs built from packages,
tests/harness/oci_bundle.py). Two weave-sbatch scripts run tests/runtime/coop_job.py in
one group, one of them with ``#SBATCH --container=BUNDLE``: its roles run inside it
(they read a file only its rootfs has, with the rootfs's own interpreter, in a mount
namespace other than the plain job's processes on the same host), still take every
turn through their host's node daemon socket (bind-mounted in), and both jobs end
COMPLETED with the same weights. Two reference GRPO jobs of one seed, one in the
bundle: the boxed one's resident worker on its training host runs in it (its root
holds the rootfs's file), and both end COMPLETED with the same weights, bit for bit.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import node_status, weaved_dirs
from tests.harness.oci_bundle import MARKER, MARKER_TEXT, make_bundle
from tests.harness.specs import job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import (
    active_groups,
    call,
    rl_on_slurm,
    serving_on_slurm,
    wait_states,
)
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.oci import read_oci_conf
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.submission import build_spec
from weave_slurm.errors import WeaveError
from weave_slurm.slurm.command_runner import run_command

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

JOB = Path(__file__).parents[1] / "runtime" / "coop_job.py"
STEPS = 2
SCRIPT = """\
#!/bin/bash
#SBATCH --job-name={name} --output=%x-%j.out --chdir={work}{container}
#WEAVE --model-params-b=0.5 --rollout-gpus=8 --train-gpus=8 --max-tokens=64
#WEAVE --rollout-s=1 --train-s=1 --rollout-state-gib=1 --train-state-gib=1
#WEAVE --iterations={steps} --cooperative
echo "$WEAVE_ROLE mntns $(readlink /proc/self/ns/mnt)"
echo "$WEAVE_ROLE marker $(cat {marker} 2>&1)"
{python} -c 'import sys; print(sys.argv[1], "python", sys.executable, sys.version.split()[0])' \
  "$WEAVE_ROLE"
exec {python} {job}
"""


def _bundle_or_skip(slurm_cluster: SessionCluster, shared_tmp: Path) -> Path:
    conf = read_oci_conf(slurm_cluster.cluster.paths.oci_conf)
    if conf is None or conf.problem():
        pytest.skip("the session cluster has no OCI runtime (install runc, then start it)")
    return make_bundle(shared_tmp / "bundle")


def _lines(text: str, role: str, what: str) -> list[str]:
    return [ln.split(f"{role} {what} ", 1)[1] for ln in text.splitlines()
            if ln.startswith(f"{role} {what} ")]


def test_srun_container_runs_a_step_in_the_bundle(slurm_cluster: SessionCluster,
                                                  shared_tmp: Path) -> None:
    """Slurm's own path: the oci.conf the cluster wrote runs ``srun --container``."""
    bundle = _bundle_or_skip(slurm_cluster, shared_tmp)
    out = run_command(
        ["srun", "-p", "h20", "-N1", "-n1", f"--container={bundle}", "/bin/cat", str(MARKER)],
        timeout_s=60, env={**os.environ, **slurm_cluster.env})
    assert out.stdout.strip() == MARKER_TEXT


def test_cooperative_job_runs_in_its_container(slurm_cluster: SessionCluster,
                                               shared_tmp: Path) -> None:
    bundle = _bundle_or_skip(slurm_cluster, shared_tmp)
    instance = f"oci{os.getpid()}"
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COOP_STEPS": str(STEPS),
               "COOP_BODY_S": "0.2"}
    specs = {}
    for name, contained in (("plain", False), ("boxed", True)):
        work = shared_tmp / name
        work.mkdir(mode=0o755)
        script = shared_tmp / f"{name}.sh"
        script.write_text(SCRIPT.format(
            name=name, work=work, steps=STEPS, marker=MARKER, job=JOB,
            container=f" --container={bundle}" if contained else "",
            python="python3.11" if contained else sys.executable))
        specs[name] = (build_spec(script, {}, environ)[0], script, work)
    cfg = rl_on_slurm(weaved_dirs(slurm_cluster.cluster, instance), instance,
                      dict(slurm_cluster.env), shared_tmp)
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        # refused at submission, in one line: a bundle without config.json
        empty = shared_tmp / "empty-bundle"
        empty.mkdir()
        bad = specs["boxed"][0].replace(str(bundle), str(empty))
        with pytest.raises(WeaveError, match=r"slurm\.container.*has no config\.json"):
            call(sock, Op.SUBMIT, spec=bad, source="bad.sh")
        ids = {name: call(sock, Op.SUBMIT, spec=text, source=str(path))["job"]
               for name, (text, path, _) in specs.items()}
        active_groups(sock, list(ids.values()), 120)
        seen: list[dict[str, Any]] = []
        rows = wait_states(sock, list(ids.values()), {"COMPLETED", "FAILED"}, 300, seen)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
    texts = {name: (specs[name][2] / f"{name}-{ids[name]}.out").read_text() for name in ids}
    for role in ("rollout", "train"):
        boxed, plain = texts["boxed"], texts["plain"]
        assert _lines(boxed, role, "marker") == [MARKER_TEXT], boxed
        assert "No such file" in _lines(plain, role, "marker")[0], plain
        assert re.fullmatch(r"/usr/bin/python3\.11 3\.11\.\d+",
                            _lines(boxed, role, "python")[0]), boxed
        assert _lines(boxed, role, "mntns") != _lines(plain, role, "mntns"), texts
        assert f"{role} done" in boxed and f"{role} done" in plain, texts
    weights = {n: (specs[n][2] / "weights.json").read_text() for n in ids}
    assert weights["boxed"] == weights["plain"] == f'{{"version": {STEPS}}}'


@pytest.mark.torch
def test_hosted_job_runs_in_its_container(slurm_cluster: SessionCluster,
                                          shared_tmp: Path) -> None:
    bundle = _bundle_or_skip(slurm_cluster, shared_tmp)
    instance = f"ocih{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    cfg = rl_on_slurm(dirs, instance, dict(slurm_cluster.env), shared_tmp)
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        ids = {name: call(sock, Op.SUBMIT, spec=job_spec(name, 31, 2) + extra,
                          source=f"{name}.toml")["job"]
               for name, extra in (("plain", ""),
                                   ("boxed", f'\n[slurm]\ncontainer = "{bundle}"\n'))}
        groups = active_groups(sock, list(ids.values()), 120)
        train = next(a["nodes"][0] for a in groups[0]["allocations"] if a["role"] == "train")

        def boxed_worker() -> int | None:
            status = node_status(slurm_cluster.cluster, train, instance) or {}
            for j in status.get("jobs", []):
                pid = (j.get("worker") or {}).get("pid")
                if j.get("job") == str(ids["boxed"]) and pid:
                    return int(pid)
            return None
        pid = wait_for(boxed_worker, 240, "the boxed job's worker on its training host",
                       interval_s=0.2)
        inside = Path(f"/proc/{pid}/root") / MARKER.relative_to("/")
        assert inside.read_text().strip() == MARKER_TEXT   # its root is the bundle's
        rows = wait_states(sock, list(ids.values()), {"COMPLETED", "FAILED"}, 300, [])
        assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
        digests = {name: (w.driver.live(job) or {}).get("weights_sha256")
                   for name, job in ids.items()}
    assert digests["boxed"] == digests["plain"] is not None, digests
