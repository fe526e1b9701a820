"""Slurm's association and QOS limits in weaved (daemon/accounting_limits.py through
daemon/limits.py) on a real store, with accounting as sacctmgr printed it
(tests/slurm/test_accounting.py): refusals and holds in Slurm's words, the shares, a
read that fails, and weaved refusing the key where there is no Slurm."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.harness.specs import stored
from tests.slurm.test_accounting import ASSOC, QOS
from weave_slurm.config.fairshare import FairShareConfig
from weave_slurm.config.site import SiteConfig, default_site
from weave_slurm.daemon import limits
from weave_slurm.daemon.accounting_limits import AccountingFeed
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import ConfigError, ExternalCommandError
from weave_slurm.model.charge import Charge
from weave_slurm.model.profile import simple_profile
from weave_slurm.slurm.accounting import Accounting, parse_associations, parse_qos

REPO = Path(__file__).resolve().parents[2]
T0 = 100_000.0
ACCT = Accounting("wtest", parse_associations(ASSOC), parse_qos(QOS))


def _site(fairshare: bool = False) -> SiteConfig:
    site = default_site()
    return dataclasses.replace(site, slurm=dataclasses.replace(site.slurm, account="physics"),
                               fairshare=FairShareConfig(enabled=fairshare))


def _feed(acct: Accounting | None = ACCT) -> AccountingFeed:
    feed = AccountingFeed(lambda: ACCT, 60.0)
    feed.current = acct
    return feed


def _job(store: Store, user: str, account: str | None = None, qos: str | None = None) -> int:
    profile = dataclasses.replace(simple_profile("j", 10, 10, 1.5),
                                  charge=Charge(account, qos))
    return store.add_job(uid=1000 + len(user), user=user, name="j", **stored("j"),
                         source="s.toml", now=T0, profile=profile)


def _running(store: Store, job_id: int) -> None:
    store.transition("job", job_id, JobState.PLACED, "t", T0, group_id=1)
    store.transition("job", job_id, JobState.RUNNING, "t", T0, started_s=T0)


def _refusal(store: Store, user: str, account: str = "physics",
             qos: str | None = None) -> str | None:
    return limits.submission_refusal(store, _site(), user, account, T0, _feed(), qos)


def test_a_user_without_an_association_is_refused_as_slurm_does(store: Store) -> None:
    said = _refusal(store, "carol")
    assert said is not None and said.startswith(
        "user carol has no association with account physics in cluster wtest's Slurm "
        "accounting (as Slurm's 'Invalid account or account/partition combination")
    assert _refusal(store, "carol", "bio") is None


def test_max_submit_counts_pending_and_running_jobs(store: Store) -> None:
    ids = [_job(store, "alice") for _ in range(5)]        # her association's MaxSubmit: 5
    _running(store, ids[0])
    assert _refusal(store, "alice") == (
        "user alice in account physics has 5 jobs pending or running, its association's "
        "MaxSubmitJobs = 5 (Slurm accounting; as Slurm's AssocMaxSubmitJobLimit)")
    assert _refusal(store, "bob") is None
    for _ in range(6):                                   # bob's default QOS small: 6 per user
        _job(store, "bob")
    said = _refusal(store, "bob")
    assert said is not None and "its MaxSubmitJobsPerUser = 6" in said \
        and "QOSMaxSubmitJobPerUserLimit" in said
    # the same user asking for QOS normal: no per-user QOS cap, but MaxSubmitJobs 10
    assert _refusal(store, "bob", qos="normal") is None


def test_running_limits_hold_jobs_with_squeues_words(store: Store) -> None:
    alice = [_job(store, "alice") for _ in range(3)]     # MaxJobs 2
    bob = [_job(store, "bob") for _ in range(4)]         # QOS small: MaxJobsPerUser 3
    q = limits.queue(store, _site(), store.jobs([JobState.PENDING]), T0, _feed())
    assert [j.job_id for j in q.ordered] == alice[:2] + bob[:3]
    assert q.held[alice[2]] == (
        "held: user alice in account physics has 2 jobs placed or running, its "
        "association's MaxJobs = 2 (Slurm accounting; as Slurm's AssocMaxJobsLimit)")
    assert "QOSMaxJobsPerUserLimit" in q.held[bob[3]]
    # the account's GrpJobs (bio: 7) counts all its users' jobs placed or running
    carol = dataclasses.replace(ACCT.associations[("bio", "carol")], max_jobs=None)
    acct = dataclasses.replace(ACCT, associations={**ACCT.associations,
                                                   ("bio", "carol"): carol})
    carols = [_job(store, "carol", account="bio") for _ in range(8)]
    for job in carols[:7]:
        _running(store, job)
    q = limits.queue(store, _site(), store.jobs([JobState.PENDING]), T0, _feed(acct))
    assert q.held[carols[7]] == (
        "held: account bio has 7 jobs placed or running, its GrpJobs = 7 (Slurm "
        "accounting; as Slurm's AssocGrpJobsLimit)")


def test_shares_come_from_the_associations(store: Store) -> None:
    a, b = _job(store, "alice"), _job(store, "bob")
    q = limits.queue(store, _site(fairshare=True), store.jobs([JobState.PENDING]), T0,
                     _feed())
    assert q.priority[a] == q.priority[b]     # neither used anything: both F = 1
    fs = limits._fairshare(_site(fairshare=True), _feed())
    assert fs.users["alice"] == 2.0 and fs.users["bob"] == 1.0 and fs.accounts["physics"] == 3.0


def test_before_a_first_read_jobs_wait_and_say_why(store: Store) -> None:
    def fail() -> Accounting:
        raise ExternalCommandError(["sacctmgr"], 1, "", "slurmdbd: Connection refused")
    feed = AccountingFeed(fail, 60.0)
    feed.refresh(T0)
    job = _job(store, "alice")
    assert limits.submission_refusal(store, _site(), "alice", "physics", T0, feed) is None
    q = limits.queue(store, _site(), store.jobs([JobState.PENDING]), T0, feed)
    assert q.ordered == [] and q.held[job].startswith(
        "waiting for Slurm's accounting (limits.from_slurm): ")
    assert "Connection refused" in q.held[job]
    feed._read = lambda: ACCT
    feed.refresh(T0 + 30)                     # not due yet
    assert feed.current is None
    feed.refresh(T0 + 60)
    assert feed.current is ACCT
    feed._read = fail
    feed.refresh(T0 + 120)                    # a failed read keeps the last good one
    assert feed.current is ACCT and feed.error is not None


def test_weaved_refuses_the_key_without_slurm(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text((REPO / "configs/site.example.toml").read_text().replace(
        "from_slurm = false", "from_slurm = true", 1))
    with pytest.raises(ConfigError, match=r"key 'limits.from_slurm' = true reads Slurm's "
                                          r"accounting, but weaved runs the local backend"):
        Weaved(DaemonConfig(state_dir=tmp_path / "state", backend="local", site_path=site))


def test_the_accounting_is_read_each_tick_with_no_job_pending(store: Store) -> None:
    """Submissions are checked against the last read: it is read on every placement
    tick, also when no job waits (before, only a tick with pending jobs read it, so the
    first submissions were never checked and later ones against an old read)."""
    from weave_slurm.daemon.placing import Placer
    from weave_slurm.placement import Capacity, WeavePolicy

    reads: list[float] = []

    def read() -> Accounting:
        reads.append(T0)
        return ACCT
    feed = AccountingFeed(read, 60.0)
    site = _site()
    placer = Placer(store, Capacity.from_site(site), WeavePolicy(), site, "t",
                    lambda seconds: None, feed)
    placer.place(T0)
    assert feed.current is ACCT and len(reads) == 1
    assert limits.submission_refusal(store, site, "carol", "physics", T0, feed) is not None
