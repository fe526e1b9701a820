"""Limits and shares read from a real Slurm accounting database: MariaDB and slurmdbd
from Debian's packages (tests/harness/slurmdbd.py), associations and QOS made with
sacctmgr as an admin makes them, then read by weaved's reader and applied by its
limits, on a real store."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from tests.harness.slurmdbd import CLUSTER, AccountingDb, accounting_db

pytestmark = pytest.mark.slurm

ADMIN = [
    ["add", "cluster", CLUSTER],
    ["add", "account", "physics", "fairshare=3", "maxjobs=4", "maxsubmit=10"],
    ["add", "account", "bio", "parent=physics", "fairshare=parent", "grpjobs=7",
     "grpsubmit=9"],
    ["add", "user", "alice", "account=physics", "fairshare=2", "maxjobs=2", "maxsubmit=5"],
    ["add", "user", "bob", "account=physics"],
    ["add", "user", "carol", "account=bio"],
    ["add", "qos", "small", "maxjobsperuser=3", "maxsubmitjobsperuser=6"],
    ["modify", "user", "bob", "set", "qos+=small", "defaultqos=small"],
]

#: Runs where the database is reachable: read it, then ask weaved's limits about a
#: store holding two running jobs of alice and one pending of each user.
SCRIPT = """
import json, sys, tempfile, dataclasses
from pathlib import Path
from weave_slurm.config.site import default_site
from weave_slurm.daemon import limits
from weave_slurm.daemon.accounting_limits import AccountingFeed
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.model.profile import simple_profile
from weave_slurm.slurm.accounting import read_accounting
from weave_slurm.slurm.command_runner import SubprocessRunner
from tests.harness.specs import stored

feed = AccountingFeed(lambda: read_accounting(SubprocessRunner(), cluster=sys.argv[1]), 60)
feed.refresh(0.0)
assert feed.current is not None, feed.error
site = default_site()
site = dataclasses.replace(site, slurm=dataclasses.replace(site.slurm, account="physics"))
store = Store(Path(tempfile.mkdtemp()) / "weaved.db")
def job(user):
    return store.add_job(uid=1000, user=user, name="j", **stored("j"), source="s.toml",
                         now=0.0, profile=simple_profile("j", 10, 10, 1.5))
for _ in range(2):
    j = job("alice")
    store.transition("job", j, JobState.PLACED, "t", 0.0, group_id=1)
    store.transition("job", j, JobState.RUNNING, "t", 0.0, started_s=0.0)
pending = {u: job(u) for u in ("alice", "bob")}
q = limits.queue(store, site, store.jobs([JobState.PENDING]), 0.0, feed)
a = feed.current
print(json.dumps({
    "alice": dataclasses.asdict(a.association("alice", "physics")),
    "bio": dataclasses.asdict(a.account_association("bio")),
    "bob_qos": dataclasses.asdict(a.qos_of("bob", "physics", None)),
    "held": {u: q.held.get(j) for u, j in pending.items()},
    "carol": limits.submission_refusal(store, site, "carol", "physics", 0.0, feed),
    "shares": a.shares()}))
"""


@pytest.fixture(scope="module")
def dbd() -> Iterator[AccountingDb]:
    with accounting_db() as db:
        for words in ADMIN:
            db.run(["sacctmgr", "-i", *words])
        yield db


def test_slurms_associations_and_qos_hold_weaved_jobs(dbd: AccountingDb) -> None:
    out = json.loads(dbd.run([sys.executable, "-c", SCRIPT, CLUSTER]))
    assert out["alice"] == {"account": "physics", "user": "alice", "share": 2.0,
                            "max_jobs": 2, "max_submit": 5, "grp_jobs": None,
                            "grp_submit": None, "qos": ["normal"], "default_qos": None}
    assert (out["bio"]["share"], out["bio"]["grp_jobs"], out["bio"]["grp_submit"]) == \
        (None, 7, 9)                                          # fairshare=parent
    assert out["bob_qos"] == {"name": "small", "max_jobs_pu": 3, "max_submit_pu": 6,
                              "max_jobs_pa": None, "max_submit_pa": None}
    assert out["held"] == {"alice": (
        "held: user alice in account physics has 2 jobs placed or running, its "
        "association's MaxJobs = 2 (Slurm accounting; as Slurm's AssocMaxJobsLimit)"),
        "bob": None}
    assert out["carol"].startswith("user carol has no association with account physics "
                                   f"in cluster {CLUSTER}'s Slurm accounting")
    assert out["shares"] == [{"root": 1.0, "alice": 2.0, "bob": 1.0, "carol": 1.0},
                             {"root": 1.0, "physics": 3.0}]
