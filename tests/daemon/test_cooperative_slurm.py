"""Cooperative jobs on the session's Slurm cluster (separate hosts): two weave-sbatch
scripts whose body runs tests/runtime/coop_job.py (``#WEAVE --cooperative``) land in
one group; each job's rollout process runs on the group's h20 node and its training
process on its h800 node (started there by the node daemons, steps of the group's
allocations, each a host of its own), they take their turns through the gate on their
own host's node daemon socket, both end COMPLETED at their iterations, and the
``#SBATCH --output`` file on the shared file system holds both roles' prints."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import weaved_dirs
from tests.harness.weaved import (
    active_groups,
    call,
    rl_on_slurm,
    serving_on_slurm,
    wait_states,
)
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.submission import build_spec

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

JOB = Path(__file__).parents[1] / "runtime" / "coop_job.py"
STEPS = 2
SCRIPT = """\
#!/bin/bash
#SBATCH --job-name={name} --output=%x-%j.out --chdir={work}
#WEAVE --model-params-b=0.5 --rollout-gpus=8 --train-gpus=8 --max-tokens=64
#WEAVE --rollout-s=1 --train-s=1 --rollout-state-gib=1 --train-state-gib=1
#WEAVE --iterations={steps} --cooperative
echo "body of $WEAVE_JOB_NAME as $WEAVE_ROLE on $(hostname)"
exec {python} {job}
"""


def test_cooperative_scripts_run_in_the_groups_allocations(slurm_cluster: SessionCluster,
                                                           shared_tmp: Path) -> None:
    env = dict(slurm_cluster.env)
    instance = f"coop{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COOP_STEPS": str(STEPS),
               "COOP_BODY_S": "0.3"}
    specs = {}
    for name in ("coop-s1", "coop-s2"):
        work = shared_tmp / name
        work.mkdir(mode=0o755)
        script = shared_tmp / f"{name}.sh"
        script.write_text(SCRIPT.format(name=name, work=work, steps=STEPS,
                                        python=sys.executable, job=JOB))
        specs[name] = (build_spec(script, {}, environ)[0], script, work)
    cfg = rl_on_slurm(dirs, instance, env, shared_tmp)
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        ids = {name: call(sock, Op.SUBMIT, spec=text, source=str(path))["job"]
               for name, (text, path, _) in specs.items()}
        groups = active_groups(sock, list(ids.values()), 120)
        assert len(groups) == 1 and sorted(groups[0]["members"]) == sorted(ids.values())
        nodes = {a["role"]: set(a["nodes"]) for a in groups[0]["allocations"]}
        seen: list[dict[str, Any]] = []
        rows = wait_states(sock, list(ids.values()), {"COMPLETED", "FAILED"}, 300, seen)
        assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
        assert {r["iter"] for r in rows} == {f"{STEPS}/{STEPS}"}
        for name, job in ids.items():
            text = (specs[name][2] / f"{name}-{job}.out").read_text()
            lines = text.splitlines()
            for role, pool in (("rollout", "rollout"), ("train", "train")):
                start = [ln for ln in lines if ln.startswith(f"{role} of job {job} starts")]
                assert len(start) == 1, text
                assert start[0].split(" on node ")[1] in nodes[pool], (start, nodes)
                assert f"body of {name} as {role} on " in text, text
                assert f"{role} done" in text, text
            assert (specs[name][2] / "weights.json").read_text() == \
                f'{{"version": {STEPS}}}'
