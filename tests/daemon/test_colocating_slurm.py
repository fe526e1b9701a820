"""Co-location through weaved on the session's Slurm cluster (2 h20 + 2 h800 nodes, each
a host of its own): issue 35's weaved slice.

A site with ``[limits] colocation = true``. A reference GRPO job whose declared
co-located iteration (12 s) is cheaper than its own disaggregated group is placed
co-located: its group holds one training allocation and no rollout allocation, and its
rollouts run on its training host. A second job, whose co-located time is dear, arrives
while it runs: it may not join the co-located group (weaved does not move a running
member's rollout off its training node) and gets a disaggregated group of its own, so
both kinds run side by side. Each ends COMPLETED with the weights of its solo run, bit
for bit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import weaved
from tests.harness.hosts import weaved_dirs
from tests.harness.scratch import public_dir
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS, job_spec
from tests.harness.waits import settle
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.daemon.protocol import Op
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.vocab import Phase

pytestmark = [pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

K = 2
SITE = "[pools.rollout]\n[pools.train]\n\n[limits]\ncolocation = true\n"


def _submit(sock: Path, public: Path, name: str, seed: int, colo_iter_s: float,
            capsys: pytest.CaptureFixture[str]) -> int:
    """The reference job, its co-located iteration declared as ``colo_iter_s``."""
    path = public / f"{name}.toml"
    path.write_text(job_spec(name, seed, K).replace(
        "[profile]\n", f"[profile]\ncolo_iter_s = {colo_iter_s}\n", 1))
    assert run_app(sbatch_app, "weave-sbatch", [str(path), "--parsable",
                                                "--socket", str(sock)]) == 0
    return int(capsys.readouterr().out.strip())


def test_a_colocated_and_a_disaggregated_group_run_side_by_side_and_match_solo(
        slurm_cluster: SessionCluster, capsys: pytest.CaptureFixture[str]) -> None:
    env = dict(slurm_cluster.env)
    instance = f"co{os.getpid()}"
    backend = SlurmCliBackend(env=env)
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    with public_dir("weaved-slurm-colo-") as public:
        site = public / "site.toml"
        site.write_text(weaved.smoke_site(SITE))
        cfg = weaved.rl_on_slurm(dirs, instance, env, public, site)
        with weaved.serving_on_slurm(cfg) as w:
            sock = w.config.socket
            assert w.capacity.colocation
            colo = _submit(sock, public, "colo", 41, 12.0, capsys)
            (group,) = weaved.active_groups(sock, [colo], 60)
            assert [a["role"] for a in group["allocations"]] == ["train"], group
            # a newcomer may not join it: a disaggregated group of its own, beside it
            apart = _submit(sock, public, "apart", 42, 1000.0, capsys)
            groups = {g["group"]: g for g in weaved.active_groups(sock, [colo, apart], 60)}
            other = next(g for g in groups.values() if apart in g["members"])
            assert other["group"] != group["group"] and other["members"] == [apart]
            assert sorted(a["role"] for a in other["allocations"]) == ["rollout", "train"]
            rows = weaved.wait_states(sock, [colo, apart], {"COMPLETED", "FAILED"}, 150, [])
            assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
            (train_host,) = group["allocations"][0]["nodes"]
            spans = list(w.driver.spans[group["group"]])  # type: ignore[attr-defined]
            rollouts = {s.node for s in spans if s.kind is Phase.ROLLOUT}
            assert rollouts == {train_host}, spans
            assert not [s for s in spans if s.kind is Phase.SYNC], spans   # nothing moved
            for job, seed in ((colo, 41), (apart, 42)):
                shown = weaved.call(sock, Op.SHOW, kind="job", id=job)
                solo = run_solo(MemberSpec(str(job), seed=seed, steps=K, options=OPTIONS))
                assert shown["runtime"]["weights_sha256"] == weights_digest(solo.weights), job
            settle(lambda: not backend.list_allocations(f"weave-g{instance}."), 30,
                   interval_s=0.3)
