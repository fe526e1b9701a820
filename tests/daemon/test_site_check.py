"""``weave site check``: each check on its own, then the whole preflight on the
session's Slurm cluster, once where everything holds and once where each part fails."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.scratch import python_open_to_users
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app as weave_app
from weave_slurm.config.site import default_site
from weave_slurm.daemon import preflight
from weave_slurm.daemon.preflight import Status
from weave_slurm.slurm.backend import NodeInfo

REPO = Path(__file__).resolve().parents[2]


def _node(name: str, partition: str, gpu: str | None, count: int) -> NodeInfo:
    return NodeInfo(name, (partition,), "IDLE", 8, gpu, count)


def test_a_pool_needs_its_partition_and_gres() -> None:
    site = default_site()
    good = [_node("a1", "h20", "h20", 8), _node("b1", "h800", "h800", 8)]
    assert [c.status for c in preflight.pools(site, lambda: good)] == [Status.OK] * 2
    short = [_node("a1", "h20", "h20", 4), _node("a2", "h20", None, 0)]
    rollout, train = preflight.pools(site, lambda: short)
    assert rollout.line() == ("FAIL partition h20 (rollout): nodes without GRES gpu:h20:8: "
                              "a1 (gpu:h20:4), a2 (gpu:?:0); set gres.conf/slurm.conf, or "
                              "the site's gpu and gpus_per_node")
    assert train.line() == ("FAIL partition h800 (train): not in sinfo (partitions: h20); "
                            "set [pools.*] partition")


def test_slurms_accounting_is_checked_where_the_site_reads_it() -> None:
    from tests.slurm.test_accounting import ASSOC, QOS
    from weave_slurm.errors import ExternalCommandError
    from weave_slurm.slurm.accounting import Accounting, parse_associations, parse_qos

    acct = Accounting("wtest", parse_associations(ASSOC), parse_qos(QOS))
    assert preflight.slurm_accounting(lambda: acct).line() == (
        "ok   slurm accounting (limits.from_slurm): cluster wtest: 4 user associations, "
        "2 QOS")

    def down() -> Accounting:
        raise ExternalCommandError(["sacctmgr"], 1, "", "Connection refused")
    failed = preflight.slurm_accounting(down)
    assert failed.status is Status.FAIL and "sacctmgr failed" in failed.detail


def test_the_state_dir_must_not_be_on_nfs(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    assert preflight.state_dir(tmp_path / "not" / "yet").status is Status.OK
    monkeypatch.setattr(preflight, "fs_type", lambda path: "nfs4")
    assert preflight.state_dir(tmp_path).line() == (
        f"FAIL state dir {tmp_path}: on nfs4: SQLite must not live on a network file "
        "system; use a local disk")


def test_a_socket_a_weaved_serves_and_a_taken_port_fail(tmp_path: Path) -> None:
    path = tmp_path / "weaved.sock"
    assert preflight.api_socket(path).status is Status.OK
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        assert preflight.api_socket(path).status is Status.FAIL
    assert preflight.api_socket(path).status is Status.OK     # stale: weaved replaces it
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert preflight.port_free("127.0.0.1", port).status is Status.FAIL
    assert preflight.port_free("127.0.0.1", port).status is Status.OK


@pytest.mark.skipif(os.geteuid() != 0, reason="checks as another user: needs root")
def test_an_interpreter_users_cannot_reach_fails(public_dir: Path) -> None:
    closed = public_dir / "closed"
    closed.mkdir(mode=0o700)
    python = closed / "python3"
    python.write_text("")
    python.chmod(0o755)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    line = preflight.interpreter(str(python), "nobody").line()
    assert line.startswith(f"FAIL node interpreter {python}: nobody cannot use the "
                           f"interpreter {python} (Permission denied)"), line
    assert line.endswith("make it readable by users (o+rx)")
    assert preflight.interpreter(str(python), "no-such-user-here").line().endswith(
        "--as-user 'no-such-user-here' is not a user here")
    closed.chmod(0o711)     # traversable: now only the standard library may still fail
    assert f"the interpreter {python}" not in preflight.interpreter(str(python), "nobody").line()


# -- on the session's Slurm cluster ------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_containers_needs_a_runtime_this_host_has(tmp_path: Path) -> None:
    conf = tmp_path / "oci.conf"
    assert preflight.containers(conf).status is Status.SKIP            # none: refused
    conf.write_text('RunTimeCreate="runc create %n"\n')
    assert "RunTimeRun" in preflight.containers(conf).detail
    conf.write_text('RunTimeRun="/nonexistent/runc run --bundle %b %n"\n')
    bad = preflight.containers(conf)
    assert bad.status is Status.FAIL and "'/nonexistent/runc' is not installed" in bad.detail
    conf.write_text('RunTimeRun="/bin/true run --bundle %b %n"\n')
    assert preflight.containers(conf).line() == (
        f"ok   containers: {conf}: RunTimeRun runs /bin/true (every node needs it and this "
        "file)")


@pytest.fixture
def slurm_env(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    yield slurm_cluster


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = run_app(weave_app, "weave", ["site", "check", *argv])
    return code, capsys.readouterr().out.splitlines()


@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="checks the interpreter as another user")
def test_site_check_passes_on_a_site_that_has_it_all(
        slurm_env: Any, public_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared = slurm_env.shared
    with python_open_to_users():
        code, lines = _check(["--state-dir", str(public_dir / "state"),
                              "--checkpoint-root", str(shared.ckpt),
                              "--path-root", str(shared.work),
                              "--metrics-port", str(_free_port()), "--as-user", "nobody"],
                             capsys)
    assert code == 0, lines
    assert [line.split(":")[0] for line in lines] == [
        "ok   partition h20 (rollout)", "ok   partition h800 (train)",
        "ok   weight transfer auto",
        f"ok   munge ({os.environ['MUNGE_SOCKET']})" if "MUNGE_SOCKET" in os.environ
        else "ok   munge",
        f"ok   checkpoint root {shared.ckpt}", f"ok   path root {shared.work}",
        f"ok   node interpreter {sys.executable}",
        "ok   containers" if shutil.which("runc") or shutil.which("crun")
        else "skip containers",
        f"ok   state dir {public_dir / 'state'}",
        f"ok   api socket {public_dir / 'state' / 'weaved.sock'}",
        "ok   metrics port 127.0.0.1"]
    assert "2 node(s) with GRES gpu:h20:8" in lines[0]


@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="checks the interpreter as another user")
def test_site_check_names_each_failure_and_exits_1(
        slurm_env: Any, public_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = public_dir / "site.toml"
    text = (REPO / "configs" / "site.example.toml").read_text()
    site.write_text(text.replace('partition = "h800"', 'partition = "a100"', 1)
                    .replace("gpus_per_node = 8", "gpus_per_node = 16", 1))
    state = public_dir / "state"
    state.mkdir()
    with socket.socket(socket.AF_UNIX) as api, socket.socket() as metrics:
        api.bind(str(state / "weaved.sock"))
        api.listen()
        metrics.bind(("127.0.0.1", 0))
        metrics.listen()
        with python_open_to_users():   # the interpreter's own failure: a unit test above
            code, lines = _check(["--site", str(site), "--state-dir", str(state),
                                  "--checkpoint-root", str(public_dir / "no-such-dir"),
                                  "--munge-socket", str(public_dir / "no-munged.sock"),
                                  "--metrics-port", str(metrics.getsockname()[1])], capsys)
    assert code == 1
    failed = {line.split(":")[0].split(" ", 1)[1].strip() for line in lines
              if line.startswith("FAIL")}
    assert failed == {"partition h20 (rollout)", "partition a100 (train)",
                      f"munge ({public_dir / 'no-munged.sock'})",
                      f"checkpoint root {public_dir / 'no-such-dir'}",
                      f"api socket {state / 'weaved.sock'}", "metrics port 127.0.0.1"}, lines
    assert any("nodes without GRES gpu:h20:16" in line for line in lines)
    assert any(line.startswith("FAIL partition a100 (train): not in sinfo (partitions: ")
               and "h800" in line for line in lines)
