"""weave-sbatch --hold / --dependency, weave hold / release, against an in-process
weaved: a held job and a job whose dependency does not hold yet stay PENDING, each
REASON saying why; released, or its dependency met, it is placed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.conftest import Running, public_dir, weaved  # noqa: F401
from tests.harness.waits import wait_for
from tests.harness.weaved import call
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op


def _job(sock: Path, job: int) -> dict:
    return call(sock, Op.STATUS, jobs=[job], all=True)["jobs"][0]


def test_hold_release_and_dependencies(weaved: Running, tmp_path: Path,  # noqa: F811
                                       capsys: pytest.CaptureFixture[str]) -> None:
    sock = weaved.socket
    s = ["--socket", str(sock)]
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("first"))

    def submit(*flags: str) -> int:
        assert run_app(sbatch_app, "weave-sbatch", [str(spec), "--parsable", *flags, *s]) == 0
        return int(capsys.readouterr().out.strip())

    first = submit("--hold")
    after = submit("-d", f"afterok:{first}")
    never = submit("--dependency", f"afternotok:{first}")
    wait_for(lambda: "held by its user" in _job(sock, first)["reason"], 20, "held reason")
    assert _job(sock, first)["state"] == "PENDING"
    waits = f"waiting for job {first} to complete (afterok:{first}; as squeue's Dependency)"
    wait_for(lambda: _job(sock, after)["reason"] == waits, 20, "the dependency's reason")
    assert run_app(app, "weave", ["release", str(first), *s]) == 0
    wait_for(lambda: _job(sock, first)["state"] == "RUNNING", 20, "released and placed")
    assert _job(sock, after)["state"] == "PENDING"            # it waits for completion
    call(sock, Op.CANCEL, jobs=[first])
    wait_for(lambda: "can never be satisfied" in _job(sock, after)["reason"], 20,
             "afterok on a cancelled job")
    assert "is CANCELLED (afterok" in _job(sock, after)["reason"]
    wait_for(lambda: _job(sock, never)["state"] == "RUNNING", 20, "afternotok met")

    assert run_app(app, "weave", ["hold", str(first), "4242", *s]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"weave hold: error: Job {first} is CANCELLED: only a pending job can "
                   "be held", "weave hold: error: Invalid job id specified: 4242"]
    assert run_app(sbatch_app, "weave-sbatch", [str(spec), "-d", "after:999", *s]) == 2
    assert "key 'slurm.dependency' = 'after:999': no job 999" in capsys.readouterr().err


def test_update_name_time_and_slo_as_scontrol(weaved: Running, tmp_path: Path,  # noqa: F811
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """weave update: a pending job's name, SLO and time limit; each change in its
    history; a running job's SLO is refused, and a user may not raise a time limit."""
    from weave_slurm.daemon.job_update import update_job
    from weave_slurm.daemon.protocol import PermissionDenied

    sock = weaved.socket
    s = ["--socket", str(sock)]
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("first"))
    assert run_app(sbatch_app, "weave-sbatch", [str(spec), "--parsable", "--hold", "-t", "90",
                                                *s]) == 0
    job = int(capsys.readouterr().out.strip())
    assert run_app(app, "weave", ["update", str(job), "-J", "renamed", "--slo", "2.5",
                                  "-t", "1:00:00", *s]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"job {job}: name first -> renamed", f"job {job}: time limit 90 min -> 60 min",
        f"job {job}: slo 3 -> 2.5"]              # job_spec_toml says slo = 3
    shown = call(sock, Op.SHOW, kind="job", id=job)
    assert shown["name"] == "renamed" and shown["slo"] == 2.5
    assert shown["transitions"][-1]["reason"].startswith("updated by uid 0: name first")
    # as another uid, who owns nothing: refused; a user may only lower a time limit
    store = weaved.weaved.store
    with pytest.raises(PermissionDenied, match="only an admin may raise"):
        update_job(store, weaved.weaved.site, 0, frozenset(), {"job": job, "time": "2:00:00"},
                   0.0)
    assert run_app(app, "weave", ["release", str(job), *s]) == 0
    wait_for(lambda: _job(sock, job)["state"] == "RUNNING", 20, "placed")
    assert run_app(app, "weave", ["update", str(job), "--slo", "3", *s]) == 1
    assert "only a pending job's SLO can change" in capsys.readouterr().err
    assert run_app(app, "weave", ["update", str(job), *s]) == 2
    assert "nothing to change" in capsys.readouterr().err
