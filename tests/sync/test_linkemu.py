"""Two namespaces joined by a shaped veth pair; the sync across the emulated slow link."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from weave_slurm.sync.group_launch import check_outcomes, run_group
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.linkemu import EmulatedLink, LinkSpec, namespace_exists, run_ip
from weave_slurm.sync.scenario import Method, Scenario
from weave_slurm.vocab import Pool

pytestmark = [pytest.mark.netns, pytest.mark.torch]

VersionsFactory = Callable[[int, list[float]], tuple[str, ...]]
MIB = 1 << 20


def test_link_is_shaped_both_ways_and_removed() -> None:
    with EmulatedLink(LinkSpec(rate_mbit=500)) as link:
        names = [link.endpoint(p).netns for p in Pool]
        for pool in Pool:
            ep = link.endpoint(pool)
            assert ep.netns is not None and namespace_exists(ep.netns)
            qdisc = run_ip(ep.wrap(["tc", "qdisc", "show", "dev", ep.ifname])).stdout
            assert "tbf" in qdisc and "500Mbit" in qdisc
            addrs = run_ip(ep.wrap(["ip", "-o", "addr", "show", "dev", ep.ifname])).stdout
            assert ep.addr in addrs
    assert not any(namespace_exists(n) for n in names if n)


def test_sync_across_the_slow_link(make_versions: VersionsFactory) -> None:
    files = make_versions(8 * MIB, [0.02])
    with EmulatedLink(LinkSpec(rate_mbit=1000)) as link:
        two = check_outcomes(run_group(Scenario(
            "job-ns", n_train=2, n_rollout=2, total_nbytes=8 * MIB, version_files=files,
            versions=(1, 2), mode=SyncMode.DELTA), link))
        naive = check_outcomes(run_group(Scenario(
            "job-ns", n_train=2, n_rollout=2, total_nbytes=8 * MIB, version_files=files[:1],
            versions=(1,), method=Method.NAIVE), link))
    rollout = [r for r in two if r["pool"] == "rollout"]
    assert all(s["identical"] for r in rollout for s in r["steps"])
    sent = [sum(r["steps"][i]["slow_link_bytes"] for r in two if r["pool"] == "train")
            for i in range(2)]
    naive_sent = sum(r["steps"][0]["slow_link_bytes"] for r in naive if r["pool"] == "train")
    assert sent[0] < 8 * MIB + 4096 and naive_sent == 2 * 8 * MIB
    assert sent[1] < 0.2 * sent[0]
