"""Issue 7's acceptance on the session's Slurm cluster (2 h20 + 2 h800 nodes, each a host
of its own).

Three reference GRPO jobs submitted with weave-sbatch land in one group (rollout
node in h20, training node in h800, node daemons as `srun --overlap` steps), run K
iterations round-robin and end with the weights of their solo runs, bit for bit.
weaved's state is on the login side only, its checkpoints on the shared root; at the
end no host keeps a file of the jobs in its /dev/shm. Prints the pools' busy fraction
and wall time grouped vs one after another.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import naming_jobs, node_shm, shm_paths, weaved_dirs
from tests.harness.processes import daemons_gone
from tests.harness.scratch import public_dir
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS, job_spec
from tests.harness.waits import settle
from tests.harness.weaved import active_groups, call, serving, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.apps.demo import stats
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.daemon.driver import DriverKind
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.runtime.timeline import Span
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.vocab import Pool

pytestmark = [pytest.mark.slurm, pytest.mark.torch,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

K = 2


def pool_stats(spans: list[Span]) -> dict[str, float]:
    """Steady window as ``weave demo`` measures it: every first rollout done -> end."""
    rollout = sorted({s.node for s in spans if s.pool is Pool.ROLLOUT})
    train = sorted({s.node for s in spans if s.pool is Pool.TRAIN})
    st = stats([spans], rollout, train)
    return {"wall_s": st.wall_s, "h20_busy": st.rollout_busy, "h800_busy": st.train_busy}


def run_jobs(sock: Path, w: Weaved, specs: list[tuple[str, int]], public: Path,
             capsys: pytest.CaptureFixture[str]) -> list[int]:
    ids = []
    for name, seed in specs:
        path = public / f"{name}.toml"
        path.write_text(job_spec(name, seed, K))
        assert run_app(sbatch_app, "weave-sbatch", [str(path), "--parsable",
                                                    "--socket", str(sock)]) == 0
        ids.append(int(capsys.readouterr().out.strip()))
    return ids


def test_grouped_jobs_on_slurm_match_solo(slurm_cluster: SessionCluster,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    env = dict(slurm_cluster.env)
    instance = f"rt{os.getpid()}"
    backend = SlurmCliBackend(env=env)
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    with public_dir("weaved-slurm-rt-") as public:
        cfg = DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance,
                           tick_s=0.3, runtime=DriverKind.RL, client_timeout_s=5.0, env=env,
                           checkpoint_root=dirs.ckpt)
        with serving(cfg, backend, prefix=f"weave-g{instance}.") as w:
            _grouped_then_alone(w, backend, instance, public, capsys)
            assert daemons_gone(dirs.node_ckpt, 20)
            ids = [j["job"] for j in call(w.config.socket, Op.STATUS, all=True)["jobs"]]
            for node in slurm_cluster.nodes:   # warm state is each host's own
                left = shm_paths(slurm_cluster.cluster, node, node_shm(instance, node))
                assert naming_jobs(left, ids) == [], (node, left)


def _grouped_then_alone(w: Weaved, backend: SlurmCliBackend, instance: str, public: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    """The test's body, on a served weaved: three jobs grouped, then each alone."""
    sock = w.config.socket
    settle(sock.exists, 30, interval_s=0.1)
    ids = run_jobs(sock, w, [(f"grpo{i}", 31 + i) for i in range(3)], public, capsys)
    seen: list[dict[str, Any]] = []
    groups = active_groups(sock, ids, 60)
    assert len(groups) == 1 and sorted(groups[0]["members"]) == sorted(ids)
    parts = {a["role"]: a["partition"] for a in groups[0]["allocations"]}
    assert parts == {"rollout": "h20", "train": "h800"}
    gid = groups[0]["group"]
    rows = wait_states(sock, ids, {"COMPLETED", "FAILED"}, 240, seen)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    assert {r["phase"] for r in seen} & {"rollout", "train"}
    for i, job in enumerate(ids):
        live = w.driver.live(job)
        assert live is not None
        solo = run_solo(MemberSpec(str(job), seed=31 + i, steps=K, options=OPTIONS))
        assert live["weights_sha256"] == weights_digest(solo.weights), f"job {job}"
    spans = list(w.driver.spans[gid])  # type: ignore[attr-defined]
    grouped = pool_stats(spans)
    # the same three jobs one after another, each alone in its own group
    iso: list[dict[str, float]] = []
    for i in range(3):
        (job,) = run_jobs(sock, w, [(f"alone{i}", 31 + i)], public, capsys)
        wait_states(sock, [job], {"COMPLETED"}, 120, [])
        gid1 = call(sock, Op.STATUS, jobs=[job])["jobs"][0]["group"]
        one = list(w.driver.spans[gid1])  # type: ignore[attr-defined]
        iso.append(pool_stats(one))
    wall = sum(x["wall_s"] for x in iso)
    isolated = {"wall_s": wall,
                "h20_busy": sum(x["h20_busy"] * x["wall_s"] for x in iso) / wall,
                "h800_busy": sum(x["h800_busy"] * x["wall_s"] for x in iso) / wall}
    with capsys.disabled():
        print(f"\nslurm acceptance (K={K}, steady window): grouped {grouped}; "
              f"isolated one after another {isolated}")
    assert grouped["h800_busy"] > 0 and isolated["h800_busy"] > 0
    settle(lambda: not backend.list_allocations(f"weave-g{instance}."), 30, interval_s=0.3)
    assert not backend.list_allocations(f"weave-g{instance}.")
