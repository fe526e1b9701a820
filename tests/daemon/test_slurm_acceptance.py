"""Issue 4's acceptance on the session's Slurm cluster (2 h20 + 2 h800 nodes, each a host
of its own; weaved and its state, in a temp dir other uids can reach, on the login side).

weave-sbatch three jobs; weave status and squeue agree on the allocations; the
three share one group; cancelling one removes its steps from squeue while the
others keep running; kill -9 and restart keeps jobs and allocations with no
duplicates; a second Unix user cannot cancel the first user's job; malformed
input is refused. Every allocation is released at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_api import NOBODY, as_user
from tests.daemon.test_restart import LAUNCH
from tests.harness.waits import wait_for
from tests.harness.weaved import call, pings
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def start(state: Path, env: dict[str, str], instance: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "--state-dir", str(state),
                             "--backend", "slurm", "--instance", instance, "--tick-s", "0.3",
                             "--node-command", "sleep infinity"],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=open(state.parent / "weaved.err", "ab"))  # noqa: SIM115
    sock = state / "weaved.sock"
    wait_for(lambda: pings(sock), 30, f"weaved answering on {sock}")
    return proc


def steps_in_squeue(backend: SlurmCliBackend, alloc_ids: set[str]) -> list[str]:
    return [s.name for a in alloc_ids for s in backend.list_steps(a)]


def test_acceptance_on_local_slurm(slurm_cluster: Any, public_dir: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    env = dict(slurm_cluster.env)
    instance = f"t{os.getpid()}"
    prefix = f"weave-g{instance}."
    backend = SlurmCliBackend(env=env)
    state = public_dir / "state"
    state.mkdir()
    sock = state / "weaved.sock"
    proc = start(state, env, instance)
    try:
        spec = public_dir / "job.toml"
        spec.write_text(job_spec_toml("rl"))
        ids = []
        for i in range(3):
            assert run_app(sbatch_app, "weave-sbatch", [str(spec), "-J", f"rl{i}", "--parsable",
                                                        "--socket", str(sock)]) == 0
            ids.append(int(capsys.readouterr().out.strip()))
        bad = public_dir / "bad.sh"
        bad.write_text("#!/bin/bash\n#WEAVE --slo=soon\n")
        assert run_app(sbatch_app, "weave-sbatch", [str(bad), "--socket", str(sock)]) == 2
        assert "--slo='soon' is not a number" in capsys.readouterr().err

        wait_for(lambda: all(j["state"] == "RUNNING" for j in
                             call(sock, Op.STATUS)["jobs"]), 60, "every job running")
        jobs = call(sock, Op.STATUS)["jobs"]
        assert len({j["group"] for j in jobs}) == 1  # the three share one group
        groups = call(sock, Op.GROUPS)["groups"]
        ours = {a["id"]: a for g in groups for a in g["allocations"]}
        squeue = {a.alloc_id: a for a in backend.list_allocations(prefix)}
        assert set(ours) == set(squeue) and len(ours) == 2  # one h20 + one h800
        for aid, a in ours.items():
            assert tuple(a["nodes"]) == squeue[aid].nodes
            assert squeue[aid].components[0].partition == a["partition"]

        steps = steps_in_squeue(backend, set(ours))
        assert steps.count("weave-node") == 2
        for j in ids:
            assert sum(n.startswith(f"weave-j{j}-") for n in steps) == 2

        denied = as_user(NOBODY, lambda: call(sock, Op.CANCEL, jobs=[ids[1]]))
        assert "permission denied" in denied["ok"]["results"][0]["message"]

        call(sock, Op.CANCEL, jobs=[ids[0]])
        wait_for(lambda: not any(n.startswith(f"weave-j{ids[0]}-")
                                 for n in steps_in_squeue(backend, set(ours))), 30,
                 f"job {ids[0]}'s steps gone from squeue")
        steps = steps_in_squeue(backend, set(ours))
        assert all(sum(n.startswith(f"weave-j{j}-") for n in steps) == 2 for j in ids[1:])

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc = start(state, env, instance)
        for _ in range(3):  # a few ticks after the restart
            call(sock, Op.PING)
        wait_for(lambda: len(call(sock, Op.STATUS)["jobs"]) == 2, 10, "two live jobs")
        after = {a.alloc_id for a in backend.list_allocations(prefix)}
        assert after == set(ours)  # same allocations, none added
        again = call(sock, Op.STATUS, all=True)["jobs"]
        assert sorted(j["job"] for j in again) == sorted(ids)
        assert {j["job"]: j["state"] for j in again} == {ids[0]: "CANCELLED",
                                                         ids[1]: "RUNNING", ids[2]: "RUNNING"}
        steps = steps_in_squeue(backend, after)
        assert steps.count("weave-node") == 2
        assert all(sum(n.startswith(f"weave-j{j}-") for n in steps) == 2 for j in ids[1:])

        call(sock, Op.CANCEL, jobs=ids[1:])
        wait_for(lambda: not backend.list_allocations(prefix), 30, "allocations released")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        for a in backend.list_allocations(prefix):
            backend.release(a.alloc_id)
