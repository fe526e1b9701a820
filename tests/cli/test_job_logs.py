"""``weave logs ID [-f]``: a job's --output file, and where weave show job says it is,
against an in-process weaved."""

from __future__ import annotations

import os
import pwd
import threading
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


def test_weave_logs_prints_and_follows_the_output_file(weaved: Running, public_dir: Path,  # noqa: F811
                                       capsys: pytest.CaptureFixture[str]) -> None:
    sock = ["--socket", str(weaved.socket)]
    work = public_dir / "submit-here"
    work.mkdir()
    spec = work / "job.toml"
    spec.write_text(job_spec_toml("logged"))
    assert run_app(sbatch_app, "weave-sbatch", [str(spec), "--parsable", "-o",
                                                str(work / "weave-%j.out"), *sock]) == 0
    job = int(capsys.readouterr().out.strip())
    out = work / f"weave-{job}.out"
    shown = call(weaved.socket, Op.SHOW, kind="job", id=job)
    assert shown["stdout"] == shown["stderr"] == str(out)        # scontrol's StdOut/StdErr
    wait_for(lambda: out.exists() and "RUNNING" in out.read_text(), 30, "lines in the file")
    assert run_app(app, "weave", ["logs", str(job), *sock]) == 0
    assert "RUNNING" in capsys.readouterr().out

    follow: dict[str, int] = {}
    t = threading.Thread(target=lambda: follow.update(rc=run_app(
        app, "weave", ["logs", "-f", str(job), *sock])))
    t.start()
    call(weaved.socket, Op.CANCEL, jobs=[job])
    t.join(60)
    assert not t.is_alive() and follow["rc"] == 0    # -f ends once the job has ended
    assert "CANCELLED" in capsys.readouterr().out
    # a job submitted without --output writes weave-%j.out in its workdir, else its home
    bare = call(weaved.socket, Op.SUBMIT, spec=job_spec_toml("bare"))["job"]
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    shown = call(weaved.socket, Op.SHOW, kind="job", id=bare)
    assert shown["stdout"] == shown["stderr"] == str(home / f"weave-{bare}.out")
    wait_for(lambda: run_app(app, "weave", ["logs", str(bare), *sock]) == 0
             and "RUNNING" in capsys.readouterr().out, 30, "the default file")
