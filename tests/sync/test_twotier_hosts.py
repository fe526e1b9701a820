"""The two-tier sync across the hosts of a separate-hosts Slurm cluster, over its shaped
inter-pool link: 2 training ranks on the two h800 hosts, 2 rollout ranks on the two h20
hosts, each a process in its own host's namespaces (``ClusterHosts``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.hosts import hosts_cluster
from weave_slurm.errors import ConfigError
from weave_slurm.sync.group_launch import ClusterHosts, check_outcomes, run_group, write_weights
from weave_slurm.sync.scenario import Scenario

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

MIB = 1 << 20
NBYTES = 4 * MIB
GBPS = 1.0


def _versions(d: Path) -> tuple[str, ...]:
    import torch

    g = torch.Generator().manual_seed(14)
    w = torch.randint(0, 256, (NBYTES,), dtype=torch.uint8, generator=g)
    w2 = w.clone()
    w2[::3] += 1
    return write_weights(d / "v1", w), write_weights(d / "v2", w2)


def test_two_by_two_across_hosts(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with hosts_cluster(tmp_path / "cluster", interpool_gbps=GBPS) as cluster:
        hosts = ClusterHosts(cluster)
        files = _versions(hosts.scratch_root)
        sc = Scenario("job-hosts", n_train=2, n_rollout=2, total_nbytes=NBYTES,
                      version_files=files, versions=(1, 2))
        before = hosts.wire_bytes()
        results = check_outcomes(run_group(sc, hosts))
        wire = hosts.wire_bytes() - before
        with pytest.raises(ConfigError, match="not on a shared file system"):
            run_group(Scenario("job-hosts", 2, 2, NBYTES, ("/dev/shm/w",), (1,)), hosts)

    # every rank ran on its own host: trainers on the h800 hosts, rollout on the h20 hosts
    assert sorted((r["pool"], r["host"]) for r in results) == [
        ("rollout", "h20-0"), ("rollout", "h20-1"), ("train", "h800-0"), ("train", "h800-1")]
    assert all(r["node"] == r["host"] for r in results)
    rollout = [r for r in results if r["pool"] == "rollout"]
    assert all(s["identical"] for r in rollout for s in r["steps"])
    for i in range(len(sc.versions)):
        sent = sum(r["steps"][i]["slow_link_bytes"] for r in results if r["pool"] == "train")
        assert sent == NBYTES  # one copy, not one per rollout rank
        # it went over the shaped link: no faster than the link's rate allows
        assert max(r["steps"][i]["elapsed_s"] for r in results) > 0.9 * NBYTES * 8 / (GBPS * 1e9)
    # the link's own counter: one copy per version (plus headers, gloo's setup, Slurm RPCs)
    copies = wire / (NBYTES * len(sc.versions))
    assert 1.0 <= copies < 1.25, f"{copies:.3f} copies of the weights crossed the link"
