"""``sacct`` over weaved's socket: the uid comes from SO_PEERCRED, a user sees only their
own usage records (another user's are refused, or left out of ``-j``), root sees all;
records grow while the jobs run (booked every tick, not at the end)."""

from __future__ import annotations

import os

import pytest

from tests.daemon.conftest import Running
from tests.daemon.test_api import NOBODY, as_user
from tests.harness.specs import with_output
from tests.harness.waits import wait_for
from tests.harness.weaved import call, state_of
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid")


def test_sacct_is_each_users_own(weaved: Running) -> None:
    sock = weaved.socket
    mine = call(sock, Op.SUBMIT, spec=job_spec_toml("root-job"), source="r.toml")["job"]
    spec = with_output(job_spec_toml("nobody-job"), weaved.state_dir.parent)   # as root
    theirs = as_user(NOBODY, lambda: call(sock, Op.SUBMIT, spec=spec,
                                          source="n.toml"))["ok"]["job"]
    wait_for(lambda: state_of(sock, mine) == "RUNNING" and state_of(sock, theirs) == "RUNNING",
             20, "both jobs running")

    def charged(records: list[dict[str, object]]) -> dict[object, object]:
        return {r["job"]: r["gpu_s"] for r in records}

    first = wait_for(lambda: call(sock, Op.SACCT, jobs=[mine, theirs])["jobs"], 20,
                     "both jobs charged", interval_s=0.1,
                     until=lambda rs: len(rs) == 2 and all(r["cost"] > 0 for r in rs))
    later = wait_for(lambda: call(sock, Op.SACCT, jobs=[mine, theirs])["jobs"], 20,
                     "the records grow while the jobs run", interval_s=0.1,
                     until=lambda rs: all(r["gpu_s"]["train"] > f["gpu_s"]["train"]
                                          for r, f in zip(rs, first, strict=True)))
    assert set(charged(later)) == {mine, theirs}

    own = as_user(NOBODY, lambda: call(sock, Op.SACCT))["ok"]["jobs"]
    assert [r["job"] for r in own] == [theirs] and own[0]["user"] == "nobody"
    picked = as_user(NOBODY, lambda: call(sock, Op.SACCT, jobs=[mine, theirs]))["ok"]["jobs"]
    assert [r["job"] for r in picked] == [theirs]          # root's job left out
    denied = as_user(NOBODY, lambda: call(sock, Op.SACCT, users=["root"]))
    assert denied["error"] == "PermissionDenied" and "only its own usage" in denied["message"]
    assert [r["job"] for r in call(sock, Op.SACCT, users=["nobody"])["jobs"]] == [theirs]
    for job in (mine, theirs):
        call(sock, Op.CANCEL, jobs=[job])
