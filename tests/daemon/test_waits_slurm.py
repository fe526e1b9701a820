"""Issue 30, item 5 on the session's cluster of separate hosts: weaved whose munge socket
does not work (``--munge-socket`` naming no munged, as README's path gave a user before
the cluster printed ``MUNGE_SOCKET``) cannot authenticate to its node daemons. Its job
says so in REASON while it waits, fails naming munge once ``[runtime] auth_wait_s`` has
passed, and Slurm lists none of weaved's allocations afterwards. The site is the
shipped example with a short deadline (and ``weight_transfer = "auto"``: its hosts are
separate)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hosts import weaved_dirs
from tests.harness.waits import wait_for
from tests.harness.weaved import call, serving, wait_states
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.driver import DriverKind
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig
from weave_slurm.slurm.cli_backend import SlurmCliBackend

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

EXAMPLE = Path(__file__).parents[2] / "configs" / "site.example.toml"
AUTH_WAIT_S = 3.0


def _site(path: Path) -> Path:
    text = re.sub(r'^weight_transfer = "\w+"', 'weight_transfer = "auto"',
                  EXAMPLE.read_text(), flags=re.M)
    text = re.sub(r"^auth_wait_s = .*$", f"auth_wait_s = {AUTH_WAIT_S}", text, flags=re.M)
    assert f"auth_wait_s = {AUTH_WAIT_S}" in text
    path.write_text(text)
    return path


def test_a_weaved_without_munge_fails_its_job_naming_munge_and_returns_its_nodes(
        slurm_cluster: SessionCluster, tmp_path: Path) -> None:
    instance = f"mw{os.getpid()}"
    dirs = weaved_dirs(slurm_cluster.cluster, instance)
    dirs.state.mkdir(parents=True, exist_ok=True)
    cfg = DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance, tick_s=0.3,
                       runtime=DriverKind.RL, client_timeout_s=10.0, env=dict(slurm_cluster.env),
                       checkpoint_root=dirs.ckpt, site_path=_site(dirs.state / "site.toml"),
                       munge_socket=str(tmp_path / "no-munged" / "munge.socket.2"))
    backend = SlurmCliBackend(env=dict(slurm_cluster.env))
    prefix = f"weave-g{instance}."
    with serving(cfg, backend, prefix=prefix):
        wait_for(cfg.socket.exists, 30, "weaved's socket", interval_s=0.1)
        job = int(call(cfg.socket, Op.SUBMIT, spec=job_spec_toml("nomunge", iterations=1),
                       source="nomunge")["job"])
        seen: list[dict[str, Any]] = []
        wait_for(lambda: [r for r in call(cfg.socket, Op.STATUS, jobs=[job])["jobs"]
                          if "munge" in str(r["reason"])], 120, "a REASON naming munge",
                 interval_s=0.2)
        said = time.monotonic()
        [row] = wait_states(cfg.socket, [job], {"FAILED", "COMPLETED", "CANCELLED"},
                            AUTH_WAIT_S + 30, seen)
        took = time.monotonic() - said
        print(f"\nREASON named munge, then FAILED {took:.1f} s later "
              f"(auth_wait_s = {AUTH_WAIT_S:g})")
        assert row["state"] == "FAILED", row
        assert f"within auth_wait_s = {AUTH_WAIT_S:g} s" in row["reason"]
        assert "munge encode" in row["reason"] and "no-munged" in row["reason"]
        assert took < AUTH_WAIT_S + 15
        running = [r for r in seen if r["state"] == "RUNNING"]
        assert running and all("munge" in r["reason"] for r in running[-3:])
        # its group's allocations went back to Slurm: squeue lists none of weaved's
        wait_for(lambda: not backend.list_allocations(prefix), 60,
                 "weaved's allocations gone from squeue", interval_s=0.5)
