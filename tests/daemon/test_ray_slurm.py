"""docs/recipes.md's Ray pattern (verl, OpenRLHF) on the session's Slurm cluster of
separate hosts: two cooperative members of one group, each with the recipe's own
``[launch]`` lines (read from the page), run their own Ray cluster (the head with the
driver on the h800 node, a node joined with ``ray start --block`` on the h20 node), a
stand-in model in verl's driver-and-actor shape (tests/daemon/ray_driver.py: the driver
holds the train turn, a rollout actor on the h20 node sits behind a gate relay), whose
loop is the page's own example, as written.

- both members are COMPLETED at their iterations (the driver's exit ends the job; the
  rollout role's ``ray start --block`` is stopped, not waited for), on disjoint ports;
- their results are deterministic (both the same: same seed, on-policy);
- afterwards no process of either member's Ray clusters is left on any host.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import weaved_dirs
from tests.harness.waits import wait_for
from tests.harness.weaved import call, rl_on_slurm, serving_on_slurm, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op

pytest.importorskip("ray", reason="the 'ray' extra is not installed")
from tests.daemon import ray_driver

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

ROOT = Path(__file__).parents[2]
STEPS = 2


def recipe_loop() -> str:
    """The driver loop docs/recipes.md gives for the Ray pattern, as written (its
    ``python`` block in "The shape both share", marked skip for the docs test)."""
    from tests.docs.blocks import doc_blocks

    found = [p.values[0].code for p in doc_blocks("docs/recipes.md", {"python"})
             if p.values[0].section == "The shape both share"]
    assert len(found) == 1, "docs/recipes.md lost its Ray pattern's python block"
    return str(found[0])


def recipe_launch() -> str:
    """The ``[launch]`` block docs/recipes.md gives for the Ray pattern, as written."""
    text = (ROOT / "docs" / "recipes.md").read_text()
    found = re.search(r"<!-- recipe: ray-launch .*?-->\n```toml\n(.*?)```", text, re.S)
    assert found, "docs/recipes.md lost its ray-launch block"
    return found.group(1)


def ray_spec(name: str, work: Path) -> str:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "RAY_JOB_STEPS": str(STEPS),
           "HOME": str(work), "RAY_USAGE_STATS_ENABLED": "0"}
    return (job_spec_toml(name, iterations=STEPS, rollout_s=10, train_s=10, workdir=str(work))
            + "\n[slurm]\noutput = \"%x-%j.out\"\n\n" + recipe_launch() + "\n[launch.env]\n"
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in env.items()))


def ray_processes(names: set[str]) -> list[str]:
    """Processes of the members' Ray clusters, on every host (one kernel): their
    environment names one of the jobs (``WEAVE_JOB_NAME``, inherited from ray start)."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if any(f"WEAVE_JOB_NAME={n}".encode() in env for n in names) and cmd:
            left.append(f"{proc.name} {cmd[:100].decode(errors='replace')}")
    return left


def test_the_ray_recipe_runs_two_members_in_one_group(slurm_cluster: SessionCluster,
                                                      shared_tmp: Path) -> None:
    t0 = time.monotonic()
    instance = f"ray{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    names = {f"ray{os.getpid()}-{x}" for x in "ab"}
    works = {}
    for name in sorted(names):
        works[name] = shared_tmp / name
        works[name].mkdir(mode=0o755)
        (works[name] / "driver.py").write_text(ray_driver.driver_source(recipe_loop()))
    cfg = rl_on_slurm(dirs, instance, dict(slurm_cluster.env), shared_tmp)
    with serving_on_slurm(cfg) as w:
        sock = w.config.socket
        ids = {name: call(sock, Op.SUBMIT, spec=ray_spec(name, works[name]),
                          source=f"{name}.toml")["job"] for name in sorted(names)}
        seen: list[dict[str, Any]] = []
        rows = wait_states(sock, list(ids.values()), {"COMPLETED", "FAILED", "CANCELLED"},
                           300, seen)
        outs = {n: (works[n] / f"{n}-{ids[n]}.out").read_text(errors="replace")
                for n in names}
        assert [r["state"] for r in rows] == ["COMPLETED"] * 2, (rows, outs)
        assert len({r["group"] for r in rows}) == 1, rows
        assert {r["iter"] for r in rows} == {f"{STEPS}/{STEPS}"}, rows
        results = [json.loads((works[n] / "result.json").read_text()) for n in sorted(names)]
        assert results[0] == results[1], results        # deterministic
        assert results[0]["sha256"] == ray_driver.alone(STEPS), results   # as if alone
        for name in names:                              # each rollout ran on its h20 node
            rollouts = re.findall(r"^v\d+ rollout on (\S+) ", outs[name], re.M)
            assert len(rollouts) == STEPS and all(n.startswith("h20") for n in rollouts), \
                outs[name]
        left = wait_for(lambda: ray_processes(names), 30, "no Ray process of the jobs left",
                        until=lambda procs: not procs)
        assert left == []
    print(f"ray recipe: two members COMPLETED in {time.monotonic() - t0:.1f} s")
