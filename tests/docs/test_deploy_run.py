"""Every command block of docs/deploy.md runs as written, as root, against the session's
cluster of separate hosts (issue 30: the documented path is the tested path).

One bash session for the whole page, in order, in a copy of the sources (the page
builds the wheel there), with the cluster's client environment (``SLURM_CONF``,
``MUNGE_SOCKET``: what ``weave cluster up`` prints) as weaved's host would have it. The
page installs into the system paths it names (/opt/weave/venv, /etc/weave, ...): the
module is skipped where any of them exists already, and removes them at the end.
About 2 minutes, most of it installing torch into the new venv.
"""

from __future__ import annotations

import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.blocks import DocBlock, doc_blocks
from tests.docs.sessions import Sessions, run_block, sessions, sources_copy, user_env
from tests.slurm.session_cluster import SessionCluster
from weave_slurm.slurm.command_runner import run_command

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]

DOC = "docs/deploy.md"
#: What the page creates on this machine (all removed at the end).
SYSTEM_PATHS = (Path("/opt/weave"), Path("/usr/local/lib/weave"), Path("/etc/weave"),
                Path("/etc/systemd/system/weaved.service"), Path("/var/lib/weave"),
                Path("/var/log/weave"), Path("/shared"))
BACKUPS = Path("/var/backups")
METRICS_PORT = 9477
#: The allocations of a weaved without --instance (docs/slurm.md: weave-g<group>-<pool>).
ALLOCATION = re.compile(r"^weave-g\d+-")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _release_allocations(env: dict[str, str]) -> None:
    """scancel what this page's weaved left in Slurm (it leaves allocations on a stop,
    for a restart to adopt), so that the session's next tests find the nodes idle."""
    out = run_command(["squeue", "-h", "-o", "%i %j"], env=env).stdout
    ids = [i for i, name in (line.split(maxsplit=1) for line in out.splitlines())
           if ALLOCATION.match(name)]
    if ids:
        run_command(["scancel", *ids], env=env)


@pytest.fixture(scope="module")
def deploy(slurm_cluster: SessionCluster,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    taken = [str(p) for p in SYSTEM_PATHS if p.exists()]
    if taken or not _port_free(METRICS_PORT):
        pytest.skip(f"docs/deploy.md would overwrite {', '.join(taken) or 'port 9477'}")
    before = set(BACKUPS.glob("weaved-*.db"))
    src = sources_copy(tmp_path_factory.mktemp("deploy") / "src")
    env = {**slurm_cluster.env}
    try:
        with sessions(tmp_path_factory, "deploy-sessions", user_env(env),
                      cwd_for={DOC: src}) as s:
            yield s
    finally:
        _release_allocations({**user_env(), **env})
        for p in SYSTEM_PATHS:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        for f in set(BACKUPS.glob("weaved-*.db")) - before:
            f.unlink()


@pytest.mark.parametrize("block", doc_blocks(DOC, {"bash", "sh"}))
def test_deploy_block(deploy: Sessions, block: DocBlock) -> None:
    run_block(deploy, block)
