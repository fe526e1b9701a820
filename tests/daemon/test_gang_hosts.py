"""Training gangs on the cluster of separate hosts (the session's cluster).

A site of 2-GPU nodes (``gpus_per_node = 2``, CPU hosts: each "GPU" is a rank process).
``wide`` asks for 4 training GPUs: 2 ranks on each of the 2 h800 hosts, one gloo world
across hosts; ``pair`` for 2: both ranks on one host; ``one`` for 1. weaved on the
login side runs them through the node daemons of the hosts, every rank a resident
worker forked by its own host's daemon. Each job ends with the weights of a solo run
of its layout (a gang of as many processes), and once they are done no host keeps a
rank's segment or process.
"""

from __future__ import annotations

import os

import pytest

from tests.harness.hosts import on_host, weaved_dirs
from tests.harness.solo import run_solo
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

#: name -> (seed, training GPUs, ranks per training node)
JOBS = {"wide": (81, 4, (2, 2)), "pair": (82, 2, (2,)), "one": (83, 1, (1,))}


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
        for name, (seed, gpus, _) in JOBS.items():
            text = job_spec_toml(name, iterations=ITERATIONS, seed=seed, options=OPTIONS,
                                 rollout_gpus=1, train_gpus=gpus)
            ids[name] = int(call(cfg.socket, Op.SUBMIT, spec=text, source=name)["job"])
        seen: list[dict[str, object]] = []
        rows = wait_states(cfg.socket, list(ids.values()), {"COMPLETED", "FAILED"}, 900, seen)
        assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
        for name, job in ids.items():
            seed, _, per_node = JOBS[name]
            spec = MemberSpec(str(job), seed=seed, steps=ITERATIONS, options=OPTIONS,
                              layout=MemberLayout(TrainLayout(per_node), RolloutLayout(1, (1,))))
            solo = run_solo_gang(spec) if sum(per_node) > 1 else run_solo(spec)
            live = w.driver.live(job)
            assert live is not None and live["weights_sha256"] == weights_digest(solo.weights), \
                f"{name} (job {job}) differs from its solo gang"
        lays = {r["job"]: r["layout"] for r in seen if r.get("layout") and r["state"] == "RUNNING"}
        wide = lays[ids["wide"]]
        assert wide["words"] == "train 2x2 ranks; rollout 1x1 engine x 1 GPU"
        assert len({n["node"] for n in wide["train"]["nodes"]}) == 2 and wide["runs"] is None
    plan = slurm_cluster.cluster.hosts_plan()
    assert plan is not None
    for node in (n.name for n in plan.nodes):   # no rank's segment left on any host
        root = f"/dev/shm/weave-nodes/{instance}/{node}"
        out = on_host(slurm_cluster.cluster, node, ["sh", "-c",
                      f"find {root} -mindepth 3 -type f 2>/dev/null; true"])
        assert out.strip() == "", f"{node}: {out}"
