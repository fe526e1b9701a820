"""Training gangs on the cluster of separate hosts (the session's cluster).

A site of 2-GPU nodes (``gpus_per_node = 2``, CPU hosts: each "GPU" is a rank process).
``wide`` asks for 4 training GPUs: 2 ranks on each of the 2 h800 hosts, one gloo world
across hosts; ``pair`` for 2: both ranks on one host; ``duo`` for 1 training GPU and 2
rollout GPUs: 2 engines on one h20 host, their slices merged by its training. weaved on the
login side runs them through the node daemons of the hosts, every rank a resident
worker forked by its own host's daemon. Each job ends with the weights of a solo run
of its layout (a gang of as many processes), and once they are done no host keeps a
rank's segment or process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.hosts import on_host, weaved_dirs
from tests.harness.processes import pid_alive
from tests.harness.solo_gang import run_solo_gang
from tests.harness.specs import OPTIONS
from tests.harness.weaved import call, serving, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.model.layout import MemberLayout, RolloutLayout, TrainLayout
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.vocab import Phase

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

ITERATIONS = 2

SITE = """\
[site]
name = "two-gpu-hosts"
[pools.rollout]
partition = "h20"
gpu = "h20"
gpus_per_node = 2
max_nodes = 2
[pools.train]
partition = "h800"
gpu = "h800"
gpus_per_node = 2
max_nodes = 2
"""

def _config(slurm_cluster: SessionCluster, instance: str) -> DaemonConfig:
    """weaved of ``instance`` on the login side, on the 2-GPU-node site."""
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    site = dirs.state.parent / f"{instance}-site.toml"
    site.parent.mkdir(parents=True, exist_ok=True)
    site.write_text(SITE)
    return DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance, tick_s=0.3,
                        runtime="rl", client_timeout_s=10.0, env=dict(slurm_cluster.env),
                        checkpoint_root=dirs.ckpt, site_path=site)


#: name -> (seed, training GPUs, ranks per training node, rollout GPUs = engines)
JOBS = {"wide": (81, 4, (2, 2), 1), "pair": (82, 2, (2,), 1), "duo": (83, 1, (1,), 2)}
PER_PROMPT = {**OPTIONS, "sampling": "per_prompt"}   # engines need a stream per prompt


def test_gangs_across_hosts_end_with_their_solo_weights(slurm_cluster: SessionCluster) -> None:
    instance = f"gh{os.getpid()}"
    cfg = _config(slurm_cluster, instance)
    backend = SlurmCliBackend(env=dict(slurm_cluster.env))
    with serving(cfg, backend, prefix=f"weave-g{instance}.") as w:
        ids = {}
        for name, (seed, gpus, _, engines) in JOBS.items():
            text = job_spec_toml(name, iterations=ITERATIONS, seed=seed, options=PER_PROMPT,
                                 rollout_gpus=engines, train_gpus=gpus)
            ids[name] = int(call(cfg.socket, Op.SUBMIT, spec=text, source=name)["job"])
        seen: list[dict[str, object]] = []
        pushes = _follow(w, cfg.socket, list(ids.values()), seen)
        rows = wait_states(cfg.socket, list(ids.values()), {"COMPLETED", "FAILED"}, 60, seen)
        assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
        # wide's weights left from both of its hosts, each its share (a sharded sync)
        wide_pushes = [r for r in pushes if r.job_id == str(ids["wide"])]
        assert wide_pushes, pushes
        for rec in wide_pushes:
            sent = {k: int(v.get("slow_link_bytes", 0)) for k, v in rec.replies.items()
                    if k.startswith("train:")}
            assert len(sent) == 2 and all(b > 0 for b in sent.values()), rec.replies
        for name, job in ids.items():
            seed, _, per_node, engines = JOBS[name]
            spec = MemberSpec(str(job), seed=seed, steps=ITERATIONS, options=PER_PROMPT,
                              layout=MemberLayout(TrainLayout(per_node),
                                                  RolloutLayout(1, (engines,))))
            solo = run_solo_gang(spec)
            live = w.driver.live(job)
            assert live is not None and live["weights_sha256"] == weights_digest(solo.weights), \
                f"{name} (job {job}) differs from its solo gang"
        lays = {r["job"]: r["layout"] for r in seen if r.get("layout") and r["state"] == "RUNNING"}
        wide = lays[ids["wide"]]
        assert wide["words"] == "train 2x2 ranks; rollout 1x1 engine x 1 GPU"
        assert len({n["node"] for n in wide["train"]["nodes"]}) == 2 and wide["runs"] is None
        duo = lays[ids["duo"]]
        assert duo["words"] == "train 1x1 rank; rollout 1x2 engines x 1 GPU" and duo["runs"] is None
    plan = slurm_cluster.cluster.hosts_plan()
    assert plan is not None
    for node in (n.name for n in plan.nodes):   # no rank's segment left on any host
        root = f"/dev/shm/weave-nodes/{instance}/{node}"
        out = on_host(slurm_cluster.cluster, node, ["sh", "-c",
                      f"find {root} -mindepth 3 -type f 2>/dev/null; true"])
        assert out.strip() == "", f"{node}: {out}"


def test_a_rank_killed_on_its_host_forms_the_gang_again(slurm_cluster: SessionCluster) -> None:
    """SIGKILL of rank 3 of ``wide`` (on the second h800 host) mid-train: the gang fails
    as a whole, is formed again from its per-rank checkpoints and ends with its solo
    gang's weights; ``pair`` goes on without a recovery."""
    import signal
    import time

    from weave_slurm.hosted.contract import rank_job
    from weave_slurm.node.protocol import Op as NodeOp
    from weave_slurm.runtime.nodes import NodeLink

    instance = f"gk{os.getpid()}"
    cfg = _config(slurm_cluster, instance)
    steps = 4
    with serving(cfg, SlurmCliBackend(env=dict(slurm_cluster.env)),
                 prefix=f"weave-g{instance}.") as w:
        ids = {}
        for name in ("wide", "pair"):
            seed, gpus, _, _ = JOBS[name]
            text = job_spec_toml(name, iterations=steps, seed=seed, options=PER_PROMPT,
                                 rollout_gpus=1, train_gpus=gpus)
            ids[name] = int(call(cfg.socket, Op.SUBMIT, spec=text, source=name)["job"])
        wide = str(ids["wide"])
        killed: list[int] = []
        deadline = time.monotonic() + 600
        while not killed and time.monotonic() < deadline:
            for runner in list(w.driver.groups.values()):  # type: ignore[attr-defined]
                m = runner.members.get(wide)
                run = m.runs.get(Phase.TRAIN) if m is not None else None
                if m is None or m.gang is None or run is None or run.init or m.version < 1:
                    continue
                slot = m.gang.slots[3]
                link = NodeLink(None, runner.config.munge_socket)   # not the runtime's own
                rows = link.call(slot.node, NodeOp.STATUS)["jobs"]
                pid = next((r["resident"] or {}).get("pid") for r in rows
                           if r["job"] == rank_job(wide, 3))
                if pid:
                    os.kill(int(pid), signal.SIGKILL)   # the hosts share one pid namespace
                    killed.append(int(pid))
                link.close()
            time.sleep(0.2)
        assert killed, "rank 3 of wide was never seen training"
        rows = wait_states(cfg.socket, list(ids.values()), {"COMPLETED", "FAILED"}, 900, [])
        assert [r["state"] for r in rows] == ["COMPLETED"] * 2, rows
        lives = {name: w.driver.live(job) for name, job in ids.items()}
        assert lives["wide"] is not None and lives["wide"]["recoveries"] >= 1
        assert lives["pair"] is not None and lives["pair"]["recoveries"] == 0
        seed, _, per_node, _ = JOBS["wide"]
        solo = run_solo_gang(MemberSpec(wide, seed=seed, steps=steps, options=PER_PROMPT,
                                        layout=MemberLayout(TrainLayout(per_node),
                                                            RolloutLayout(1, (1,)))))
        assert lives["wide"]["weights_sha256"] == weights_digest(solo.weights)


def test_a_cancelled_gang_leaves_no_rank_process_and_no_segment_on_any_host(
        slurm_cluster: SessionCluster) -> None:
    """``wide`` (2 hosts x 2 ranks) cancelled mid-run: every rank's resident worker is
    gone and no host keeps a segment of it, while ``pair`` runs on to its end."""
    import time

    from weave_slurm.hosted.contract import rank_job
    from weave_slurm.node.protocol import Op as NodeOp
    from weave_slurm.runtime.nodes import NodeLink

    instance = f"gc{os.getpid()}"
    cfg = _config(slurm_cluster, instance)
    with serving(cfg, SlurmCliBackend(env=dict(slurm_cluster.env)),
                 prefix=f"weave-g{instance}.") as w:
        ids = {}
        for name, steps in (("wide", 50), ("pair", 3)):
            seed, gpus, _, _ = JOBS[name]
            text = job_spec_toml(name, iterations=steps, seed=seed, options=PER_PROMPT,
                                 rollout_gpus=1, train_gpus=gpus)
            ids[name] = int(call(cfg.socket, Op.SUBMIT, spec=text, source=name)["job"])
        wide = str(ids["wide"])
        pids: dict[str, int] = {}
        deadline = time.monotonic() + 600
        while len(pids) < 4 and time.monotonic() < deadline:
            for runner in list(w.driver.groups.values()):  # type: ignore[attr-defined]
                m = runner.members.get(wide)
                if m is None or m.gang is None or m.version < 1:
                    continue
                link = NodeLink(None, runner.config.munge_socket)
                try:
                    for slot in m.gang.slots:
                        rows = link.call(slot.node, NodeOp.STATUS)["jobs"]
                        pid = next(((r["resident"] or {}).get("pid") for r in rows
                                    if r["job"] == rank_job(wide, slot.rank)), None)
                        if pid:
                            pids[slot.job.job_id] = int(pid)
                finally:
                    link.close()
            time.sleep(0.3)
        assert len(pids) == 4, pids

        def segments(node: str) -> str:    # wide's (and its ranks') files in node's shm
            root = f"/dev/shm/weave-nodes/{instance}/{node}"
            return on_host(slurm_cluster.cluster, node, ["sh", "-c",
                           f"find {root} -mindepth 3 -type f \\( -path '*/{wide}/*' -o "
                           f"-path '*/{wide}.[re]*/*' \\) 2>/dev/null; true"]).strip()
        held = segments("h800-1")     # ranks 2 and 3 keep their state shards there
        assert f"/{wide}.r2/" in held and f"/{wide}.r3/" in held, held
        assert call(cfg.socket, Op.CANCEL, jobs=[ids["wide"]])["results"][0]["ok"]
        wait_states(cfg.socket, [ids["wide"]], {"CANCELLED"}, 120, [])
        for _ in range(100):   # the ranks' workers are stopped by the drop on each node
            if not any(pid_alive(p) for p in pids.values()):
                break
            time.sleep(0.2)
        assert [j for j, p in pids.items() if pid_alive(p)] == []
        plan = slurm_cluster.cluster.hosts_plan()
        assert plan is not None
        for node in (n.name for n in plan.nodes):
            assert segments(node) == "", node
        rows = wait_states(cfg.socket, [ids["pair"]], {"COMPLETED", "FAILED"}, 600, [])
        assert rows[0]["state"] == "COMPLETED", rows


def _follow(w: object, sock: Path, ids: list[int], seen: list[dict[str, object]],
            timeout_s: float = 900.0) -> list[object]:
    """Poll until every job of ``ids`` ended; every weights push the group runners
    recorded on the way (a runner's records go with it when its group drains)."""
    import time

    found: dict[tuple[str, int], object] = {}
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for runner in list(w.driver.groups.values()):  # type: ignore[attr-defined]
            try:
                recs = list(getattr(runner.transfer, "records", ()))
            except RuntimeError:      # appended to meanwhile: read it next time
                continue
            for r in recs:
                if r.name == "weights":
                    found[(r.job_id, r.version)] = r
        rows = call(sock, Op.STATUS, jobs=ids)["jobs"]
        seen.extend(rows)
        if all(r["state"] in ("COMPLETED", "FAILED") for r in rows):
            break
        time.sleep(0.3)
    return list(found.values())
