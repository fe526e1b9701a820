"""Hostile input to the daemon's socket and to the spec / site / directive / trace parsers:
no crash, no traceback, every refusal one line naming its cause; slow and oversized
clients do not stall the daemon (another client gets answers meanwhile)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemon.conftest import Running
from tests.harness.weaved import call
from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import parse_site
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.submission import read_directives
from weave_slurm.errors import WeaveError
from weave_slurm.sim.loader import read_trace_file

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() |
                           st.text(max_size=20), lambda c: st.lists(c, max_size=4) |
                           st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=10)


@contextlib.contextmanager
def _refused_in_one_line() -> Iterator[None]:
    """What runs inside either passes or is refused with a one-line WeaveError."""
    try:
        yield
    except WeaveError as exc:
        assert str(exc) and "\n" not in str(exc).strip() and "Traceback" not in str(exc)


def _raw(sock_path: Path, data: bytes) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(sock_path))
        s.sendall(data)
        reply = s.makefile("rb").readline()
    return dict(json.loads(reply))


@FAST
@given(data=st.binary(max_size=2048))
def test_random_bytes_get_one_line_errors(weaved: Running, data: bytes) -> None:
    line = data.replace(b"\n", b" ") + b"\n"
    reply = _raw(weaved.socket, line)
    if reply["ok"]:  # random bytes that happen to be a valid request (e.g. {"op":"ping"})
        return
    assert isinstance(reply["message"], str) and "\n" not in reply["message"]
    assert reply["error"] != "WeaveError" or "internal error" not in str(reply["message"])


@FAST
@given(op=st.sampled_from([o.value for o in Op]) | st.text(max_size=10),
       args=st.dictionaries(st.sampled_from(["spec", "source", "jobs", "users", "all",
                                             "kind", "id", "uid", "op"]), json_values,
                            max_size=5))
def test_wrong_types_in_requests(weaved: Running, op: str, args: dict[str, object]) -> None:
    reply = _raw(weaved.socket, (json.dumps({"op": op, **args}) + "\n").encode())
    if not reply["ok"]:
        assert "\n" not in str(reply["message"])
        assert "internal error" not in str(reply["message"]), reply  # a bug, not a refusal


def test_spoofed_uid_is_ignored(weaved: Running) -> None:
    job = call(weaved.socket, Op.SUBMIT, spec=job_spec_toml("spoof"), uid=4242, user="mallory")
    row = call(weaved.socket, Op.STATUS, jobs=[job["job"]])["jobs"][0]
    assert row["uid"] == 0 and row["user"] == "root"
    assert call(weaved.socket, Op.PING, uid=4242)["uid"] == 0


def test_slowloris_and_oversized_clients_do_not_stall(weaved: Running) -> None:
    held = []
    for _ in range(20):  # clients that never finish a line
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(weaved.socket))
        s.sendall(b'{"op": "pi')
        held.append(s)
    big = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    big.connect(str(weaved.socket))
    big.sendall(b"[" * (200 * 1024))  # a huge unfinished line, under the limit
    answered = [call(weaved.socket, Op.PING)["uid"] for _ in range(20)]
    assert answered == [0] * 20
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(weaved.socket))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"{" * (1024 * 1024))  # the daemon answers and closes at the limit
        assert json.loads(s.makefile().readline())["error"] == "LineTooLong"
    for s in [*held, big]:
        s.close()


def test_one_user_holding_connections_cannot_starve_the_others(weaved: Running) -> None:
    """A user at the per-user limit is refused in one line; other users are still served."""
    from tests.harness.processes import run_as

    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # user nobody holds the per-user maximum of connections
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        held = [_connect(weaved.socket) for _ in range(16)]   # the server's max_per_uid
        os.write(ready_w, b"x")
        os.read(done_r, 1)
        for s in held:
            s.close()
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"x"
        assert call(weaved.socket, Op.PING)["uid"] == 0        # root is still served

        def one_more() -> str:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(weaved.socket))
                reply = json.loads(s.makefile().readline())
                return f"{reply['error']}: {reply['message']}"
        # a typed refusal a client may retry (valid, not satisfiable now)
        assert run_as(NOBODY, one_more) == (
            "ServerBusy: uid 65534 already has 16 connections to weaved "
            "(at most 16 per user); close one and retry")
    finally:
        os.write(done_w, b"y")
        os.waitpid(pid, 0)
    assert run_as(NOBODY, lambda: str(_ping(weaved.socket))) == "65534"   # freed again


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    s.sendall(b'{"op": "ping"}\n')
    s.makefile().readline()          # served: it holds a slot now
    return s


def _ping(path: Path) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(b'{"op": "ping"}\n')
        return int(json.loads(s.makefile().readline())["result"]["uid"])


NOBODY = 65534


@FAST
@given(text=st.text(max_size=400))
def test_job_spec_fuzz(text: str) -> None:
    with _refused_in_one_line():
        parse_job(text, "fuzz.toml")


@FAST
@given(base=st.sampled_from(job_spec_toml("x").splitlines()), junk=st.text(max_size=30),
       pos=st.integers(0, 15))
def test_job_spec_mutations(base: str, junk: str, pos: int) -> None:
    lines = job_spec_toml("x").splitlines()
    lines.insert(pos % len(lines), f"{base.split('=')[0]}= {junk}" if "=" in base else junk)
    with _refused_in_one_line():
        parse_job("\n".join(lines), "fuzz.toml")


@FAST
@given(text=st.text(max_size=400))
def test_site_config_fuzz(text: str) -> None:
    with _refused_in_one_line():
        parse_site(text, "site.toml")


@FAST
@given(lines=st.lists(st.sampled_from(["#WEAVE ", "#SBATCH -J ", "#WEAVE --slo=", "#!/bin/sh",
                                       "#WEAVE --rollout-gpus ", "echo hi", ""]).flatmap(
    lambda p: st.text(max_size=25).map(lambda t: p + t)), max_size=8))
def test_weave_directives_fuzz(lines: list[str]) -> None:
    with _refused_in_one_line():
        read_directives("\n".join(lines), "job.sh")


@FAST
@given(text=st.text(max_size=300), suffix=st.sampled_from([".toml", ".csv", ".txt", ".trace"]))
def test_trace_file_fuzz(text: str, suffix: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as f:
        f.write(text)
    path = Path(f.name)
    try:
        with _refused_in_one_line():
            read_trace_file(path)
    finally:
        path.unlink()
