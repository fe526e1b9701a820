"""A hosted job's --output/--error on a node (node/job_streams.py): what its phase code
prints and logs goes to the files an activation names, opened as the job's uid,
appended across phases; resident.log keeps the worker's own lines; a file the uid
cannot open fails the phase, naming the path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.scratch import public_dir, python_open_to_users
from tests.harness.waits import wait_for
from weave_slurm.errors import ConfigError
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.job_streams import paths
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op

pytestmark = pytest.mark.torch
NOBODY = 65534

ENTRY = """
import logging, os, sys

def talk(ctx):
    print(f"job says hello from phase {ctx.phase} #{ctx.activation} uid {os.getuid()}")
    logging.basicConfig(stream=sys.stderr, format="LOG %(message)s", force=True)
    logging.getLogger("job").warning("job logs to stderr #%d", ctx.activation)
    return "ok"
"""


@pytest.fixture(scope="module")
def code() -> Iterator[dict[str, Path]]:
    with python_open_to_users(), public_dir("weave-job-output-") as root:
        (root / "entry.py").write_text(ENTRY)
        (root / "entry.py").chmod(0o644)
        logs = root / "logs"
        logs.mkdir()
        logs.chmod(0o777)
        private = root / "private"
        private.mkdir(mode=0o700)
        yield {"entry": root / "entry.py", "logs": logs, "private": private}


def _owner() -> int:
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def _run(c: NodeClient, job: str, code: dict[str, Path], **files: Any) -> dict[str, Any]:
    c.call(Op.ACTIVATE, job=job, phase="train", entry=f"{code['entry']}:talk", **files)
    return dict(wait_for(lambda: c.call(Op.PHASE, job=job)["worker"], 60, f"{job}'s phase",
                         interval_s=0.02, until=lambda w: w["state"] != "running"))


def test_paths_one_named_file_takes_both_streams() -> None:
    assert paths(None, None) == (None, None)
    assert paths("/o", None) == ("/o", "/o")
    assert paths(None, "/e") == ("/e", "/e")
    assert paths("/o", "/e") == ("/o", "/e")
    with pytest.raises(ConfigError, match="'output' must be an absolute path"):
        paths("o.log", None)


def test_phase_output_goes_to_the_jobs_files_as_its_uid(
        resident_node: NodeDaemon, code: dict[str, Path]) -> None:
    owner, logs = _owner(), code["logs"]
    out = logs / "j1.out"
    with NodeClient(resident_node.config.socket) as c:
        c.register("j1", uid=owner)
        first = _run(c, "j1", code, output=str(out))
        assert first["state"] == "exited" and first["result"] == "ok", first
        _run(c, "j1", code, output=str(out))              # appended, the same worker
        lines = out.read_text().splitlines()
        assert lines == [f"job says hello from phase train #1 uid {owner}",
                         "LOG job logs to stderr #1",
                         f"job says hello from phase train #2 uid {owner}",
                         "LOG job logs to stderr #2"], lines
        st = out.stat()
        assert st.st_uid == owner and st.st_mode & 0o777 == 0o644
        resident_log = Path(first["log_path"]).read_text()
        assert "job says hello" not in resident_log        # only the worker's own lines

        err = logs / "j1.err"
        split = _run(c, "j1", code, output=str(out), error=str(err))
        assert split["state"] == "exited", split
        assert out.read_text().splitlines()[-1] == \
            f"job says hello from phase train #3 uid {owner}"
        assert err.read_text().splitlines() == ["LOG job logs to stderr #3"]

        # no file named: the worker's stdout stays in resident.log
        _run(c, "j1", code)
        assert "phase train #4" in Path(first["log_path"]).read_text()
        assert "#4" not in out.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job's uid differs from ours")
def test_a_file_the_uid_cannot_open_fails_the_phase_naming_it(
        resident_node: NodeDaemon, code: dict[str, Path]) -> None:
    target = code["private"] / "j2.out"
    with NodeClient(resident_node.config.socket) as c:
        c.register("j2", uid=NOBODY)
        failed = _run(c, "j2", code, output=str(target))
        assert failed["state"] == "failed", failed
        assert failed["error"] == (f"ConfigError: cannot open the job's --output file "
                                   f"{target} as uid {NOBODY}: Permission denied")
        assert not target.exists()                         # root wrote nothing there
        assert _run(c, "j2", code)["state"] == "exited"    # the worker serves on
        with pytest.raises(ConfigError, match="'output' must be an absolute path"):
            c.call(Op.ACTIVATE, job="j2", phase="train", entry=f"{code['entry']}:talk",
                   output="rel.out")
