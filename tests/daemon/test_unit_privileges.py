"""The systemd unit's capabilities are the ones weaved's own work on its host needs.

Under the unit's ``CapabilityBoundingSet`` (``setpriv``: root keeps only those after
exec, as under systemd), weaved's submission check still becomes the submitter
(``daemon/access.py``) and still reads a user's 0700 checkpoint directory (a lost
node's newest checkpoint, ``runtime/resume.py``); without ``CAP_SETUID`` or
``CAP_DAC_READ_SEARCH`` each of them fails, so each capability is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from weave_slurm.cli.daemon_cmd import unit_text
from weave_slurm.node.checkpoint import MANIFEST, PREFIX

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv")

_SCRIPT = """
import json, sys
from weave_slurm.daemon.access import Kind, Need, probe
from weave_slurm.node.checkpoint import CheckpointStore
from weave_slurm.node.index import JobRef
codes = probe([Need("python", sys.argv[1], Kind.PROGRAM)], int(sys.argv[3]))
try:
    store = CheckpointStore(sys.argv[2])
    info = store.read(store.latest(JobRef("7", int(sys.argv[3]))))
    read = info.versions
except Exception as exc:
    read = repr(exc)
print(json.dumps({"probe": codes, "read": read}))
"""


def unit_caps() -> list[str]:
    line = next(x for x in unit_text().splitlines() if x.startswith("CapabilityBoundingSet="))
    return line.removeprefix("CapabilityBoundingSet=").split()


def _as_weaved(caps: list[str], prog: Path, ckpt: Path) -> dict[str, Any]:
    bounding = ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in caps)])
    res = subprocess.run(["setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--",
                          sys.executable, "-c", _SCRIPT, str(prog), str(ckpt), str(NOBODY)],
                         capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def test_the_units_capabilities_are_enough_and_each_is_needed(public_dir: Path) -> None:
    prog = public_dir / "python3"          # what a submission's check stats as the user
    prog.write_text("")
    prog.chmod(0o755)
    ckpt = public_dir / "ckpt"              # <root>/<uid>/<job>/ckpt-<seq>, the user's
    job = ckpt / str(NOBODY) / "7"
    one = job / f"{PREFIX}1"
    one.mkdir(parents=True)
    manifest = one / MANIFEST
    manifest.write_text(json.dumps({"seq": 1, "versions": {"state": 3}, "size_bytes": 10}))
    for path in (ckpt / str(NOBODY), job, one):
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o700)
    os.chown(manifest, NOBODY, NOBODY)
    manifest.chmod(0o600)

    caps = unit_caps()
    assert caps == ["CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_READ_SEARCH"]
    ok = _as_weaved(caps, prog, ckpt)
    assert ok == {"probe": [0], "read": {"state": 3}}, ok
    no_setuid = _as_weaved([c for c in caps if c != "CAP_SETUID"], prog, ckpt)
    assert no_setuid["probe"] == [1] and no_setuid["read"] == {"state": 3}   # EPERM
    no_read = _as_weaved([c for c in caps if c != "CAP_DAC_READ_SEARCH"], prog, ckpt)
    assert no_read["probe"] == [0] and "Permission denied" in str(no_read["read"]), no_read


@pytest.mark.slurm
@pytest.mark.torch
def test_weaved_under_the_units_capabilities_runs_a_users_job(slurm_cluster: Any) -> None:
    """The whole of weaved (the unit's ExecStart flags) under the unit's bounding set, on
    the session's Slurm cluster: an ordinary user's job is checked, placed, run on the
    hosts and completed."""
    from tests.daemon.test_api import as_user
    from tests.harness.hosts import weaved_dirs
    from tests.harness.scratch import open_to_users, public_dir, python_open_to_users
    from tests.harness.specs import job_spec, with_output
    from tests.harness.waits import wait_for
    from tests.harness.weaved import call, pings, release_all
    from weave_slurm.daemon.protocol import Op
    from weave_slurm.slurm.cli_backend import SlurmCliBackend

    instance = f"caps{os.getpid()}"
    ckpt = weaved_dirs(slurm_cluster.cluster, instance).ckpt
    bounding = ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in unit_caps())])
    backend = SlurmCliBackend(env=dict(slurm_cluster.env))
    work = slurm_cluster.shared.work   # the job's output: the nodes and nobody reach it
    with python_open_to_users(), open_to_users(work / "outputs"), \
            public_dir("weaved-caps-") as public:  # users reach it
        state = public / "state"
        argv = ["setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--",
                sys.executable, "-m", "weave_slurm.cli", "daemon", "--backend", "slurm",
                "--instance", instance, "--state-dir", str(state), "--tick-s", "0.3",
                "--checkpoint-root", str(ckpt), "--log-file", str(public / "w.log")]
        sock = state / "weaved.sock"
        proc = subprocess.Popen(argv, env={**os.environ, **slurm_cluster.env},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=Path(__file__).resolve().parents[2])
        try:
            wait_for(lambda: pings(sock), 60, f"weaved answering on {sock}")
            status = Path(f"/proc/{proc.pid}/status").read_text()
            assert "CapBnd:\t00000000000000e4" in status    # setuid, setgid, kill, dac_r_s
            spec = with_output(job_spec("caps", 5, 2), slurm_cluster.shared.work)
            got = as_user(NOBODY, lambda: call(sock, Op.SUBMIT, spec=spec,
                                               source="caps.toml"))
            assert "ok" in got, got
            job = got["ok"]["job"]
            row = wait_for(lambda: call(sock, Op.STATUS, jobs=[job])["jobs"][0], 240,
                           f"job {job} ended", interval_s=0.5,
                           until=lambda r: r["state"] in ("COMPLETED", "FAILED"))
            assert (row["state"], row["user"]) == ("COMPLETED", "nobody"), \
                (row, (public / "w.log").read_text()[-2000:])
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            release_all(backend, f"weave-g{instance}.")
