"""A job's own code on a node: its workdir, its pythonpath first on sys.path, and its own
python (a zygote of that interpreter, run as the job's uid, reused, retired)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness.scratch import public_dir, python_open_to_users
from tests.harness.waits import wait_for
from tests.runtime.own_code import imports_weave, second_venv, user_package
from weave_slurm.errors import ConfigError
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.node.zygotes import Interpreter

pytestmark = pytest.mark.torch
NOBODY = 65534

ENTRY = """
import os, sys

def where(ctx):
    import my_pkg.job
    return {"executable": sys.executable, "cwd": os.getcwd(), "path0": sys.path[0],
            "uid": os.getuid(), "pid": os.getpid(), "module": my_pkg.job.__file__}
"""


@pytest.fixture(scope="module")
def code() -> Iterator[dict[str, Path]]:
    """A public dir with the entry file, the user's package and a second venv; this
    interpreter reachable by the job's uid (workers forked from the node daemon's own
    zygote import lazily as that uid)."""
    with python_open_to_users(), public_dir("weave-own-code-") as root:
        (root / "entry.py").write_text(ENTRY)
        (root / "entry.py").chmod(0o644)
        work = root / "work"
        work.mkdir(mode=0o777)
        work.chmod(0o777)
        bare = root / "bare"
        bare.mkdir()
        yield {"root": root, "entry": root / "entry.py", "src": user_package(root),
               "work": work, "python": second_venv(root),
               "bare": second_venv(bare, with_torch=False)}


def _owner() -> int:
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def _run(c: NodeClient, job: str, code: dict[str, Path], **more: Any) -> dict[str, Any]:
    reply = c.call(Op.ACTIVATE, job=job, phase="train", entry=f"{code['entry']}:where",
                   pythonpath=[str(code["src"])], **more)
    assert reply["resident"] and reply["state"] == "running"
    done = wait_for(lambda: c.call(Op.PHASE, job=job)["worker"], 60, f"{job}'s phase",
                    interval_s=0.02, until=lambda w: w["state"] != "running")
    assert done["state"] == "exited", done
    return dict(done["result"])


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("Uid:")[1].split()[0])


def test_a_job_runs_in_its_workdir_with_its_pythonpath_and_its_own_python(
        resident_node: NodeDaemon, code: dict[str, Path]) -> None:
    pool = resident_node.pool
    assert pool is not None
    python, owner = code["python"], _owner()
    assert not imports_weave(python)    # weave comes from the node daemon's installation
    with NodeClient(resident_node.config.socket) as c:
        c.register("j1", uid=owner)
        c.register("j2", uid=owner)
        c.put_state(c.register("j3", uid=owner), "weights", {"w": torch.ones(2)}, version=1)
        default = _run(c, "j1", code)
        assert default["executable"] == sys.executable and default["uid"] == owner
        assert default["path0"] == str(code["src"])          # pythonpath first
        assert default["module"] == str(code["src"] / "my_pkg" / "job.py")
        assert default["cwd"] == str(resident_node.store.root / str(owner) / "j1")

        t0 = time.monotonic()
        own = _run(c, "j1", code, python=str(python), workdir=str(code["work"]))
        first_s = time.monotonic() - t0
        assert (own["executable"], own["cwd"], own["path0"], own["uid"]) == \
            (str(python), str(code["work"]), str(code["src"]), owner)
        assert own["pid"] != default["pid"]                # a worker of the other zygote
        key = Interpreter(str(python), owner)
        zygote = pool.zygote_pids()[key]
        assert zygote is not None and _uid_of(zygote) == owner   # never root
        again = _run(c, "j1", code, python=str(python), workdir=str(code["work"]))
        assert again["pid"] == own["pid"]                  # resident: the same worker
        other = _run(c, "j2", code, python=str(python))
        assert other["executable"] == str(python) and other["pid"] != own["pid"]
        assert pool.zygote_pids()[key] == zygote           # one zygote per interpreter
        print(f"first activation with its own python: {first_s:.2f} s (zygote start)")

        # back to the default: the job interpreter's zygote stays while j2 needs it
        assert _run(c, "j1", code)["executable"] == sys.executable
        assert key in pool.zygote_pids()
        c.call(Op.DROP, job="j2")
        wait_for(lambda: key not in pool.zygote_pids(), 10, "the unused zygote retired")
        wait_for(lambda: not Path(f"/proc/{zygote}").exists(), 10, "its process gone")
        assert pool.broken is None


def test_an_interpreter_that_cannot_serve_fails_the_activation_saying_why(
        resident_node: NodeDaemon, code: dict[str, Path]) -> None:
    pool = resident_node.pool
    assert pool is not None
    with NodeClient(resident_node.config.socket) as c:
        c.register("j1", uid=_owner())
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=r"no worker with its python: .*exited "
                           r"\(status 1\) before it was ready: ModuleNotFoundError: No "
                           r"module named 'torch'"):
            c.call(Op.ACTIVATE, job="j1", phase="train", entry=f"{code['entry']}:where",
                   python=str(code["bare"]))
        assert time.monotonic() - t0 < 30        # not the 120 s start timeout
        with pytest.raises(ConfigError, match=r"cannot start /nowhere/bin/python .*No "
                           r"such file"):
            c.call(Op.ACTIVATE, job="j1", phase="train", entry=f"{code['entry']}:where",
                   python="/nowhere/bin/python")
        with pytest.raises(ConfigError, match=r"'python' must be an absolute path"):
            c.call(Op.ACTIVATE, job="j1", phase="train", entry=f"{code['entry']}:where",
                   python="venv/bin/python")
        # the node daemon's own zygote is untouched: the same job runs with it
        assert _run(c, "j1", code)["executable"] == sys.executable
        assert pool.broken is None and list(pool.zygote_pids()) == [Interpreter()]
