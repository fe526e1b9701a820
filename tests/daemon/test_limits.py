"""Fair share and limits in weaved (daemon/limits.py, daemon/placing.py) on a real store:
the order pending jobs are placed in, jobs held by max_running (REASON), and
submissions refused by max_pending or a rate, in one line naming the limit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.harness.specs import stored
from weave_slurm.config.fairshare import FairShareConfig, JobLimits
from weave_slurm.config.site import SiteConfig, default_site
from weave_slurm.daemon import limits
from weave_slurm.daemon.records import UsageRow
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.errors import InsufficientResources
from weave_slurm.model.profile import simple_profile
from weave_slurm.placement import Placement, Refusal

T0 = 100_000.0


def _site(fairshare: bool = False, user: JobLimits | None = None,
          account: JobLimits | None = None) -> SiteConfig:
    site = default_site()
    lim = dataclasses.replace(site.limits, user=user or JobLimits(),
                              account=account or JobLimits())
    return dataclasses.replace(site, limits=lim,
                               fairshare=FairShareConfig(enabled=fairshare))


def _job(store: Store, user: str, at: float = T0, name: str = "j") -> int:
    return store.add_job(uid=1000 + len(user), user=user, name=name, **stored(name),
                         source="s.toml", now=at, profile=simple_profile(name, 10, 10, 1.5))


def _running(store: Store, job_id: int) -> None:
    store.transition("job", job_id, JobState.PLACED, "t", T0, group_id=1)
    store.transition("job", job_id, JobState.RUNNING, "t", T0, started_s=T0)


def test_fair_share_places_the_user_who_used_less_first(store: Store) -> None:
    old = _job(store, "alice", T0 - 7200)
    store.book_usage([UsageRow(old, 1, {"rollout": 3.6e6, "train": 0.0},
                               {"rollout": 0.0, "train": 0.0},
                               {"rollout": 0.0, "sync": 0.0, "train": 0.0}, 0.0, (), T0)], [])
    store.transition("job", old, JobState.CANCELLED, "done", T0, ended_s=T0)
    a, b = _job(store, "alice", T0), _job(store, "bob", T0 + 60)
    pending = store.jobs([JobState.PENDING])
    fair = limits.queue(store, _site(fairshare=True), pending, T0 + 120)
    assert [j.job_id for j in fair.ordered] == [b, a]             # bob used nothing
    assert fair.priority[b] > fair.priority[a]
    assert [j.job_id for j in limits.queue(store, _site(), pending, T0).ordered] == [a, b]


def test_max_running_holds_a_job_and_says_which_limit(store: Store) -> None:
    first = _job(store, "alice")
    _running(store, first)
    a2, b = _job(store, "alice"), _job(store, "bob")
    q = limits.queue(store, _site(user=JobLimits(max_running=1)),
                     store.jobs([JobState.PENDING]), T0)
    assert [j.job_id for j in q.ordered] == [b]
    assert q.held[a2] == ("held: user alice has 1 job placed or running, the site's limit "
                          "(limits.user.max_running = 1; as Slurm's QOSMaxJobsPerUserLimit)")
    # an account's limit counts all its users (none named: one account, '(none)')
    q = limits.queue(store, _site(account=JobLimits(max_running=2)),
                     store.jobs([JobState.PENDING]), T0)
    assert [j.job_id for j in q.ordered] == [a2] and "account (none) has 2 jobs" in q.held[b]


def test_submissions_past_a_limit_are_refused_naming_it(store: Store) -> None:
    for _ in range(2):
        _job(store, "alice")
    site = _site(user=JobLimits(max_pending=2))
    assert limits.submission_refusal(store, site, "alice", "(none)", T0) == (
        "user alice has 2 pending jobs, the site's limit (limits.user.max_pending = 2; as "
        "Slurm's QOSMaxSubmitJobPerUserLimit)")
    assert limits.submission_refusal(store, site, "bob", "(none)", T0) is None
    rate = _site(account=JobLimits(submissions_per_minute=2))
    assert "limits.account.submissions_per_minute = 2" in str(
        limits.submission_refusal(store, rate, "bob", "(none)", T0 + 30))
    assert limits.submission_refusal(store, rate, "bob", "(none)", T0 + 61) is None


def test_a_placement_that_lets_a_later_job_overtake_is_redone_in_order() -> None:
    placed = Placement("1", None, None, 0.0, 0.0, 0)  # type: ignore[arg-type]
    wait = Refusal("2", ("no room",), retry=True)
    assert limits.overtaken([wait, placed]) and not limits.overtaken([placed, wait])
    assert not limits.overtaken([Refusal("3", ("never",), retry=False), placed])


def test_weaved_refuses_a_submission_past_max_pending_in_one_line(public_dir: Path) -> None:
    """Over the socket: with max_running = 1 and max_pending = 2, a user's first job is
    placed, the next two wait (held), and the fourth is refused, naming the limit;
    nothing is stored for it."""
    from tests.harness.waits import wait_for
    from tests.harness.weaved import call, serving
    from weave_slurm.config.render import job_spec_toml
    from weave_slurm.daemon.protocol import Op
    from weave_slurm.daemon.service import DaemonConfig

    site = public_dir / "site.toml"
    site.write_text((Path(__file__).parents[2] / "configs" / "site.example.toml").read_text()
                    + "\n[limits.user]\nmax_pending = 2\nmax_running = 1\n")
    cfg = DaemonConfig(state_dir=public_dir / "state", tick_s=0.1, site_path=site,
                       node_command=("sleep", "infinity"), client_timeout_s=1.0)
    with serving(cfg, join_s=10):
        first = call(cfg.socket, Op.SUBMIT, spec=job_spec_toml("j0"))["job"]
        wait_for(lambda: call(cfg.socket, Op.STATUS)["jobs"][0]["state"] != "PENDING", 20,
                 "the first job placed")
        ids = [first, *(call(cfg.socket, Op.SUBMIT, spec=job_spec_toml(f"j{i}"))["job"]
                        for i in (1, 2))]
        with pytest.raises(InsufficientResources) as refused:
            call(cfg.socket, Op.SUBMIT, spec=job_spec_toml("j3"))
        assert "job refused: user root has 2 pending jobs, the site's limit " \
               "(limits.user.max_pending = 2" in str(refused.value)
        assert "\n" not in str(refused.value)
        assert [j["job"] for j in call(cfg.socket, Op.STATUS)["jobs"]] == ids
