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

import pytest

from tests.harness.hosts import on_host, weaved_dirs
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

#: name -> (seed, training GPUs, ranks per training node, rollout GPUs = engines)
JOBS = {"wide": (81, 4, (2, 2), 1), "pair": (82, 2, (2,), 1), "duo": (83, 1, (1,), 2)}
PER_PROMPT = {**OPTIONS, "sampling": "per_prompt"}   # engines need a stream per prompt


def test_gangs_across_hosts_end_with_their_solo_weights(slurm_cluster: SessionCluster) -> None:
    instance = f"gh{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    site = dirs.state.parent / f"{instance}-site.toml"
    site.parent.mkdir(parents=True, exist_ok=True)
    site.write_text(SITE)
    cfg = DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance, tick_s=0.3,
                       runtime="rl", client_timeout_s=10.0, env=dict(slurm_cluster.env),
                       checkpoint_root=dirs.ckpt, site_path=site)
    backend = SlurmCliBackend(env=dict(slurm_cluster.env))
    with serving(cfg, backend, prefix=f"weave-g{instance}.") as w:
        ids = {}
        for name, (seed, gpus, _, engines) in JOBS.items():
            text = job_spec_toml(name, iterations=ITERATIONS, seed=seed, options=PER_PROMPT,
                                 rollout_gpus=engines, train_gpus=gpus)
            ids[name] = int(call(cfg.socket, Op.SUBMIT, spec=text, source=name)["job"])
        seen: list[dict[str, object]] = []
        rows = wait_states(cfg.socket, list(ids.values()), {"COMPLETED", "FAILED"}, 900, seen)
        assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
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
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    site = dirs.state.parent / f"{instance}-site.toml"
    site.parent.mkdir(parents=True, exist_ok=True)
    site.write_text(SITE)
    cfg = DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance, tick_s=0.3,
                       runtime="rl", client_timeout_s=10.0, env=dict(slurm_cluster.env),
                       checkpoint_root=dirs.ckpt, site_path=site)
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
