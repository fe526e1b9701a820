"""A user's own job module through weaved on the LocalBackend: the package lies outside
the repository and is not on weaved's path. Submitted with ``pythonpath`` and
``workdir`` it completes (with the reference job's weights bit for bit: it *is* the
reference job, under the user's name); with its own ``python`` too, its workers ran
that interpreter; without ``pythonpath`` it is refused at submission, saying what is
missing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.solo import run_solo
from tests.harness.specs import OPTIONS
from tests.harness.weaved import call, rl_config, serving, wait_states
from tests.runtime.own_code import imports_weave, second_venv, seen, user_package
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import ConfigError
from weave_slurm.node.segments import weights_digest
from weave_slurm.runtime.group import MemberSpec

pytestmark = pytest.mark.torch

ITERATIONS = 2
ENTRY = "my_pkg.job:make"


def test_a_users_own_module_and_python_run_through_weaved() -> None:
    assert importlib.util.find_spec("my_pkg") is None     # not on weaved's path
    with public_dir("weave-own-") as root, shm_dir("weave-own-") as shm, \
            serving(rl_config(root, shm, path_roots=(root,))) as w:
        sock = w.config.socket
        src = user_package(root / "code")
        python = second_venv(root / "env")
        assert not imports_weave(python)
        works = {name: root / f"work-{name}" for name in ("path", "python")}
        for work in works.values():
            work.mkdir(mode=0o755)
        specs = {
            "path": job_spec_toml("own-path", entry=ENTRY, seed=31, iterations=ITERATIONS,
                                  options=OPTIONS, workdir=str(works["path"]),
                                  pythonpath=[str(src)]),
            "python": job_spec_toml("own-python", entry=ENTRY, seed=32,
                                    iterations=ITERATIONS, options=OPTIONS,
                                    workdir=str(works["python"]), python=str(python),
                                    pythonpath=[str(src)]),
        }
        # without its pythonpath the module is not found: refused at submission, in the
        # job's own interpreter (it failed on the nodes once its allocation was paid for)
        none = job_spec_toml("no-path", entry=ENTRY, seed=33, iterations=ITERATIONS,
                             options=OPTIONS)
        with pytest.raises(ConfigError, match="No module named 'my_pkg'"):
            call(sock, Op.SUBMIT, spec=none, source="none.toml")
        ids = {k: call(sock, Op.SUBMIT, spec=s, source=f"{k}.toml")["job"]
               for k, s in specs.items()}
        rows = {r["job"]: r for r in wait_states(sock, list(ids.values()),
                                                 {"COMPLETED", "FAILED"}, 240, [])}
        for key, seed in (("path", 31), ("python", 32)):
            row = rows[ids[key]]
            assert row["state"] == "COMPLETED", (key, row)
            live = w.driver.live(ids[key])
            assert live is not None
            solo = run_solo(MemberSpec(str(ids[key]), seed=seed, steps=ITERATIONS,
                                       options=OPTIONS))
            assert live["weights_sha256"] == weights_digest(solo.weights), key

        # where the workers ran: the job's workdir, its pythonpath first, its interpreter
        for key, interpreter in (("path", sys.executable), ("python", str(python))):
            records = seen(works[key])
            assert len(records) >= 2, f"job {key}: my_pkg.job:make ran {records}"
            for r in records:   # one per worker that built the job (training, rollout)
                assert (r["executable"], r["cwd"], r["path0"]) == \
                    (interpreter, str(works[key]), str(src)), (key, r)
                assert r["module"] == str(src / "my_pkg" / "job.py")
        assert {Path(str(r["prefix"])) for r in seen(works["python"])} == \
            {python.parents[1]}
