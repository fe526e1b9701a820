"""Multi-user isolation with two real Unix users (``weave-test-a``, ``weave-test-b``).

Each client call runs in a child forked from this process that drops to the user for
good with ``setgroups`` + ``setresgid`` + ``setresuid`` (a fork, not ``runuser``, so the
child shares this process's imports). Where a child or a job's worker imports modules
lazily, ``python_for_users`` lets other uids reach this VM's Python. Checked:

1. B cannot cancel or ``show`` A's job through weaved, nor read its spec through any
   view; A and root can. Refusals are one line; A's job keeps running.
2. ``uid``/``user`` claimed in a request body are ignored: SO_PEERCRED decides.
3. A's job on the local backend (node daemons + resident worker): shm and checkpoint
   files are A's, 0600 in 0700 dirs; B's open() fails with EACCES, B cannot signal,
   ptrace or read /proc of A's worker, which really runs as A.
4. B cannot attach_info / drop / activate / checkpoint A's job on the node daemon.
5. Spec paths cannot escape the submitter's own directories (``..``, elsewhere, symlinks).
6. Names and arguments reach Slurm without shell interpretation.
7. What a job's workers need (its ``workdir``, ``python``, ``pythonpath``, else the node
   interpreter) is checked at submit as the submitter's uid; a user's own ``python``
   runs their job where the node interpreter is closed to them.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import Running
from tests.harness.processes import worker_pid
from tests.harness.scratch import public_dir as scratch_dir
from tests.harness.specs import job_spec
from tests.harness.waits import wait_for
from tests.harness.weaved import call, serving, state_of
from tests.reliability.conftest import TestUser
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app as weave_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.config.job import check_paths, parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import ConfigError, WeaveError
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op as NodeOp
from weave_slurm.slurm.backend import (
    AllocationRequest,
    ResourceSpec,
    StepSpec,
    StepState,
)
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.command_runner import BackgroundProcess, CommandResult, SubprocessRunner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become other users")

_LIBC = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17


# -- running code as another user -------------------------------------------------------

def as_user(user: TestUser | None, fn: Callable[[], Any]) -> dict[str, Any]:
    """Run ``fn`` in a forked child as ``user`` (None: stay root).

    Returns ``{"ok": value}`` or ``{"error": class, "message": str, "errno": n}``, plus
    what the child wrote to stdout/stderr. Everything the child needs is imported here.
    """
    with tempfile.TemporaryFile() as result, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # child: drop to the user for good, call, report, exit
            code = 0
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115  (not pytest's)
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                if user is not None:
                    os.setgroups(os.getgrouplist(user.name, user.gid))
                    os.setresgid(user.gid, user.gid, user.gid)
                    os.setresuid(user.uid, user.uid, user.uid)
                    if os.getresuid() != (user.uid,) * 3:
                        raise RuntimeError("setresuid did not take")
                reply: dict[str, Any] = {"ok": fn()}
            except WeaveError as exc:
                reply = {"error": type(exc).__name__, "message": str(exc)}
            except BaseException as exc:
                reply = {"error": type(exc).__name__, "message": str(exc),
                         "errno": getattr(exc, "errno", None)}
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                os.write(result.fileno(), json.dumps(reply, default=str).encode())
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child could not report"
        for f in (result, out, err):
            f.seek(0)
        reply = json.loads(result.read() or b"null")
        assert reply is not None, "the child reported nothing"
        reply["stdout"], reply["stderr"] = out.read().decode(), err.read().decode()
        return dict(reply)


def raw(sock: Path, request: dict[str, Any]) -> dict[str, Any]:
    """One raw request line, the reply as the daemon sent it (no client-side checks)."""
    import socket as socketlib

    with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return dict(json.loads(buf))


def weave(user: TestUser | None, sock: Path, *argv: str) -> dict[str, Any]:
    """``weave <argv> --socket <sock>`` as ``user``; ``ok`` is the exit code."""
    return as_user(user, lambda: run_app(weave_app, "weave", [*argv, "--socket", str(sock)]))


def one_line(text: str) -> bool:
    return bool(text.strip()) and "\n" not in text.strip() and "Traceback" not in text


# -- 1 and 2: weaved's socket --------------------------------------------------------------

MARK = "secret-marker-7f3a"  # in A's spec only: must never reach B


#: An own entry (a light module every user imports), not a built-in: a built-in checks
#: its [options] at submission, and these specs carry options of the test's own.
OWN_ENTRY = "weave_slurm.workloads.grpo_options:GrpoToyOptions"


def private_spec(name: str) -> str:
    return job_spec_toml(name, entry=OWN_ENTRY, options={"note": MARK})


def test_other_user_cannot_cancel_show_or_read_a_job(
        weaved: Running, test_users: tuple[TestUser, TestUser],
        python_for_users: list[str]) -> None:
    a, b = test_users
    sock = weaved.socket
    sub = as_user(a, lambda: call(sock, Op.SUBMIT, spec=private_spec("a-job"), source="a.toml"))
    job = sub["ok"]["job"]
    spare = as_user(a, lambda: call(sock, Op.SUBMIT, spec=job_spec_toml("a-two"), source="a2"))
    job2 = spare["ok"]["job"]
    wait_for(lambda: state_of(sock, job) == "RUNNING", 30, "A's job running")
    row = call(sock, Op.STATUS, jobs=[job])["jobs"][0]
    assert (row["uid"], row["user"]) == (a.uid, a.name)

    # B, through the CLI: one line on stderr, exit 1, nothing on stdout
    for argv in (("cancel", str(job)), ("show", "job", str(job))):
        r = weave(b, sock, *argv)
        assert r.get("ok") == 1, r
        assert one_line(r["stderr"]) and "ermission denied" in r["stderr"], r
        assert f"owned by {a.name}" in r["stderr"] and MARK not in r["stderr"] + r["stdout"]
    # B, through the socket: cancel refused per id, show refused, views carry no spec
    denied = as_user(b, lambda: call(sock, Op.CANCEL, jobs=[job]))["ok"]["results"][0]
    assert not denied["ok"] and one_line(denied["message"])
    assert as_user(b, lambda: call(sock, Op.SHOW, kind="job", id=job))["error"] \
        == "PermissionDenied"
    views = as_user(b, lambda: [call(sock, Op.STATUS, all=True), call(sock, Op.GROUPS),
                                call(sock, Op.SHOW, kind="group", id=row["group"])])
    seen = json.dumps(views["ok"])
    assert f'"job": {job}' in seen  # listed, as squeue lists everyone's jobs
    assert MARK not in seen and "a.toml" not in seen and '"spec"' not in seen
    assert state_of(sock, job) == "RUNNING"

    # A sees its own details; root cancels A's other job; A cancels its own
    shown = weave(a, sock, "show", "job", str(job), "--json")
    assert shown["ok"] == 0 and MARK in json.loads(shown["stdout"])["spec"]
    assert call(sock, Op.CANCEL, jobs=[job2])["results"][0]["ok"]
    assert weave(a, sock, "cancel", str(job))["ok"] == 0
    wait_for(lambda: {state_of(sock, job), state_of(sock, job2)} == {"CANCELLED"}, 30,
             "both cancelled")
    trans = call(sock, Op.SHOW, kind="job", id=job2)["transitions"]
    assert any("cancelled by uid 0" in t["reason"] for t in trans)


def test_admin_uid_may_act_on_every_job(public_dir: Path,
                                        test_users: tuple[TestUser, TestUser]) -> None:
    """``--admin-uid B``: B may show and cancel A's job (as root may); A still may not
    touch B's."""
    a, b = test_users
    cfg = DaemonConfig(state_dir=public_dir / "state", tick_s=0.1, admin_uids=(b.uid,),
                       node_command=("sleep", "infinity"), client_timeout_s=1.0)
    sock = cfg.socket
    with serving(cfg, join_s=10):
        job = as_user(a, lambda: call(sock, Op.SUBMIT, spec=private_spec("a-job"),
                                      source="a"))["ok"]["job"]
        b_job = as_user(b, lambda: call(sock, Op.SUBMIT, spec=job_spec_toml("b-job"),
                                        source="b"))["ok"]["job"]
        assert as_user(b, lambda: call(sock, Op.PING))["ok"]["admin"] is True
        assert as_user(a, lambda: call(sock, Op.PING))["ok"]["admin"] is False
        shown = as_user(b, lambda: call(sock, Op.SHOW, kind="job", id=job))["ok"]
        assert MARK in shown["spec"]
        refused = as_user(a, lambda: call(sock, Op.CANCEL, jobs=[b_job]))["ok"]["results"][0]
        assert not refused["ok"] and "permission denied" in refused["message"]
        done = as_user(b, lambda: call(sock, Op.CANCEL, jobs=[job, b_job]))["ok"]["results"]
        assert [r["ok"] for r in done] == [True, True], done
        wait_for(lambda: {state_of(sock, job), state_of(sock, b_job)} == {"CANCELLED"}, 30,
                 "both cancelled by the admin")


def test_uid_claimed_in_the_request_is_ignored(
        weaved: Running, test_users: tuple[TestUser, TestUser]) -> None:
    a, b = test_users
    sock = weaved.socket
    job = as_user(a, lambda: call(sock, Op.SUBMIT, spec=job_spec_toml("a-job"),
                                  source="a"))["ok"]["job"]
    # B claims to be A (uid and user), and root, in every request that could use it
    claims: dict[str, Any] = {"uid": a.uid, "user": a.name, "peer_uid": 0, "admin": True}
    replies = as_user(b, lambda: [
        raw(sock, {"op": "cancel", "jobs": [job], **claims}),
        raw(sock, {"op": "show", "kind": "job", "id": job, **claims}),
        raw(sock, {"op": "ping", **claims}),
        raw(sock, {"op": "submit", "spec": job_spec_toml("b-job"), "source": "b", **claims})])
    cancel, show, ping, submit = replies["ok"]
    assert not cancel["result"]["results"][0]["ok"]
    assert (show["ok"], show["error"]) == (False, "PermissionDenied")
    assert ping["result"]["uid"] == b.uid and ping["result"]["admin"] is False
    b_job = submit["result"]["job"]
    rows = {r["job"]: r for r in call(sock, Op.STATUS, jobs=[job, b_job])["jobs"]}
    assert (rows[b_job]["uid"], rows[b_job]["user"]) == (b.uid, b.name)
    assert rows[job]["state"] in ("PENDING", "PLACED", "RUNNING")
    # a spec's own `user` key is not trusted either
    spoof = as_user(b, lambda: call(sock, Op.SUBMIT, spec=job_spec_toml("b-as-a", user=a.name),
                                    source="b"))["ok"]["job"]
    assert call(sock, Op.STATUS, jobs=[spoof])["jobs"][0]["uid"] == b.uid


# -- 3 and 4: A's job on real node daemons --------------------------------------------------

# rl_weaved: weaved with the group runtime on the LocalBackend (conftest re-exports it)


def worker_pids(node_socks: Sequence[Path], job: str) -> list[int]:
    return [pid for sock in node_socks if (pid := worker_pid(sock, job))]


def open_errno(path: str, flags: int = os.O_RDONLY) -> int:
    """0 if ``path`` opens, else the errno."""
    try:
        os.close(os.open(path, flags))
    except OSError as exc:
        return exc.errno or -1
    return 0


def probe_as_other(paths: list[str], dirs: list[str], pids: list[int]) -> dict[str, Any]:
    """What another uid gets for each file, directory and process of the job."""
    out: dict[str, Any] = {"open": {p: open_errno(p, os.O_RDWR) for p in paths},
                           "read": {p: open_errno(p) for p in paths}, "list": {}, "kill": {},
                           "proc": {}, "ptrace": {}}
    for d in dirs:
        try:
            os.listdir(d)
            out["list"][d] = 0
        except OSError as exc:
            out["list"][d] = exc.errno
    for pid in pids:
        try:
            os.kill(pid, 0)
            out["kill"][pid] = 0
        except OSError as exc:
            out["kill"][pid] = exc.errno
        out["proc"][pid] = {f: open_errno(f"/proc/{pid}/{f}")
                            for f in ("environ", "mem", "maps", "fd/0")}
        ctypes.set_errno(0)
        rc = _LIBC.ptrace(PTRACE_ATTACH, pid, None, None)
        out["ptrace"][pid] = ctypes.get_errno() if rc == -1 else 0
        if rc == 0:
            _LIBC.ptrace(PTRACE_DETACH, pid, None, None)
    return out


def _still_there(top: Path) -> list[Path]:
    """Everything under ``top`` that exists while we walk it (the job runs on and
    rotates its checkpoints: a directory may vanish mid-walk)."""
    out = []
    for root, dirs, files in os.walk(top, onerror=lambda _exc: None):
        out += [Path(root) / name for name in (*dirs, *files)]
    return out


@pytest.mark.torch
@pytest.mark.slow
def test_job_state_processes_and_checkpoints_are_private(
        rl_weaved: tuple[Weaved, Path, Path], test_users: tuple[TestUser, TestUser],
        python_for_users: list[str]) -> None:
    pytest.importorskip("torch")
    a, b = test_users
    w, sock, shm = rl_weaved
    job = as_user(a, lambda: call(sock, Op.SUBMIT, spec=job_spec("a-rl", 3, 400),
                                  source="a.toml"))["ok"]["job"]
    jid = str(job)
    ckpt_root = w.config.state_dir / "ckpt"

    def running() -> bool:
        live = w.driver.live(job)
        row = call(sock, Op.STATUS, jobs=[job])["jobs"][0]
        assert row["state"] in ("PENDING", "PLACED", "RUNNING"), (row["state"], row["reason"])
        # a group still waiting for its node daemons has a live row without a version
        return live is not None and (live["version"] or 0) >= 1 and \
            any(p.name.startswith("ckpt-") for p in ckpt_root.rglob("*"))
    wait_for(running, 180, "A's job trained a step and checkpointed")
    node_socks = sorted((w.config.state_dir / "nodes").glob("*.sock"))
    assert node_socks

    # 3a. ownership and modes: every dir and file of the job is A's, 0700 / 0600
    job_dirs = [p for p in (*shm.rglob(jid), *ckpt_root.rglob(jid)) if p.is_dir()]
    assert len(job_dirs) >= 3, job_dirs  # shm on both nodes + a checkpoint dir
    files, dirs = [], []
    for top in job_dirs:
        assert top.parent.name == str(a.uid), top
        for p in (top.parent, top, *_still_there(top)):
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue     # an older checkpoint, rotated away while we look
            assert st.st_uid == a.uid, (p, st.st_uid)
            if stat.S_ISDIR(st.st_mode):
                assert stat.S_IMODE(st.st_mode) == 0o700, (p, oct(st.st_mode))
                dirs.append(str(p))
            else:
                assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, \
                    (p, oct(st.st_mode))
                files.append(str(p))
    segs = [f for f in files if f.endswith(".seg")]
    assert any("/dev/shm/" in f for f in segs) and any(str(ckpt_root) in f for f in segs)
    assert any(f.endswith(".json") for f in files)

    # 3b. the worker runs as A
    pids = worker_pids(node_socks, jid)
    assert pids, "no resident worker of A's job"
    for pid in pids:
        uids = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[:4]
        assert uids == [str(a.uid)] * 4, (pid, uids)

    # 3c. B: EACCES on every file and dir, EPERM on kill/ptrace, nothing of /proc
    seen = as_user(b, lambda: probe_as_other(files, dirs, pids))["ok"]
    print(f"probed {len(files)} files, {len(dirs)} dirs, {len(pids)} workers as B")
    assert set(seen["open"].values()) == {errno.EACCES}, seen["open"]
    assert set(seen["read"].values()) == {errno.EACCES}, seen["read"]
    assert set(seen["list"].values()) == {errno.EACCES}, seen["list"]
    assert set(seen["kill"].values()) == {errno.EPERM}, seen["kill"]
    assert set(seen["ptrace"].values()) == {errno.EPERM}, seen["ptrace"]
    for pid, got in seen["proc"].items():
        assert set(got.values()) <= {errno.EACCES, errno.EPERM}, (pid, got)
    # ... while A itself can (the refusals are about B, not about everyone)
    mine = as_user(a, lambda: probe_as_other(segs[:2], dirs[:2], pids[:1]))["ok"]
    assert set(mine["read"].values()) == {0} and set(mine["list"].values()) == {0}
    assert set(mine["kill"].values()) == {0}

    # 4. B on the node daemons' sockets: every op naming A's job is refused
    def node_ops() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for nsock in node_socks:
            for op, extra in ((NodeOp.ATTACH_INFO, {}), (NodeOp.DROP, {}),
                              (NodeOp.ACTIVATE, {"phase": "train",
                                                 "entry": "os:getpid", "args": []}),
                              (NodeOp.DEACTIVATE, {}), (NodeOp.CHECKPOINT, {}),
                              (NodeOp.RESTORE, {}), (NodeOp.PHASE, {}),
                              (NodeOp.PUT, {"name": "weights", "nbytes": 4096}),
                              (NodeOp.COMMIT, {"name": "weights", "token": "t"}),
                              (NodeOp.ABORT, {"name": "weights", "token": "t"}),
                              (NodeOp.REGISTER, {"uid": b.uid})):
                try:
                    with NodeClient(nsock, timeout_s=5.0) as c:
                        out.append({"op": op.value, "ok": c.call(op, job=jid, **extra)})
                except WeaveError as exc:
                    out.append({"op": op.value, "error": type(exc).__name__,
                                "message": str(exc)})
            with NodeClient(nsock, timeout_s=5.0) as c:  # claims A's uid: ignored
                reg = c.call(NodeOp.REGISTER, job="b-own", uid=a.uid)
                out.append({"op": "register-claim", "ok": reg})
                status = c.call(NodeOp.STATUS)
                out.append({"op": "status", "ok": [j["job"] for j in status["jobs"]]
                            + list(status["memory"]["per_job_bytes"])})
                c.call(NodeOp.DROP, job="b-own")
        return out
    results = as_user(b, node_ops)["ok"]
    for r in results:
        if r["op"] == "register-claim":
            assert r["ok"]["uid"] == b.uid, r
        elif r["op"] == "status":
            assert jid not in r["ok"], r
        else:
            assert r.get("error") == "StateError" and one_line(r["message"]), r
            assert "may not touch" in r["message"] or "already registered" in r["message"]
    assert state_of(sock, job) == "RUNNING"
    assert sorted(worker_pids(node_socks, jid)) == sorted(pids)  # untouched workers
    v0 = w.driver.live(job)["version"]  # type: ignore[index]
    wait_for(lambda: w.driver.live(job)["version"] > v0, 60,  # type: ignore[index]
             "A's job keeps training after B's attempts")

    # A cancels its own job: its state is dropped everywhere
    assert weave(a, sock, "cancel", str(job))["ok"] == 0
    wait_for(lambda: state_of(sock, job) == "CANCELLED", 60, "cancelled")
    wait_for(lambda: not any(p.name == jid for p in (*shm.rglob("*"), *ckpt_root.rglob("*"))),
             30, "A's shm and checkpoints removed")


# -- 5. paths in specs -------------------------------------------------------------------------

def path_spec(value: str, key: str = "out_dir") -> str:
    return job_spec_toml("paths", entry=OWN_ENTRY, options={key: value})


def test_spec_paths_cannot_escape_the_users_dirs(
        weaved: Running, test_users: tuple[TestUser, TestUser],
        python_for_users: list[str]) -> None:
    a, b = test_users
    sock = weaved.socket
    home_a, home_b = Path(a.home), Path(b.home)
    links = [home_a / "to-b", home_a / "to-etc", home_a / "to-own"]
    own = home_a / "runs"
    own.mkdir(exist_ok=True)
    os.chown(own, a.uid, a.gid)
    for link, target in zip(links, (home_b, Path("/etc"), own), strict=True):
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        os.chown(link, a.uid, a.gid, follow_symlinks=False)
    try:
        refused = {
            "dotdot": (f"{home_a}/runs/../../{b.name}/x", "'..' is not allowed"),
            "elsewhere": ("/etc/weave-out", "outside your own directories"),
            "other-home": (f"{home_b}/out", "outside your own directories"),
            "link-to-b": (f"{links[0]}/out", "outside your own directories"),
            "link-to-etc": (f"{links[1]}", "outside your own directories"),
            "relative": ("./runs/out", "must be an absolute path"),
            "home-relative": ("~/runs", "must be an absolute path"),
            "climbing": ("runs/../../x", "must be an absolute path"),
            "tmp": ("/tmp/x/y", "outside your own directories"),
        }
        for why, (value, expect) in refused.items():
            for key in ("out_dir", "checkpoint_path", "data"):  # by its name or its form
                r = as_user(a, lambda v=value, k=key: call(sock, Op.SUBMIT,  # type: ignore[misc]
                                                            spec=path_spec(v, k), source="a"))
                assert r.get("error") == "ConfigError", (why, key, r)
                assert f"key 'options.{key}'" in r["message"] and expect in r["message"], r
                assert one_line(r["message"]) and str(home_a) in r["message"], r
        accepted = [f"{own}/out", f"{links[2]}/out", f"{home_a}/new/dir"]
        for value in accepted:
            r = as_user(a, lambda v=value: call(sock, Op.SUBMIT,  # type: ignore[misc]
                                                spec=path_spec(v), source="a"))
            assert "job" in r.get("ok", {}), (value, r)
        # the same path is A's, not B's: B may not name A's directory
        r = as_user(b, lambda: call(sock, Op.SUBMIT, spec=path_spec(f"{own}/out"), source="b"))
        assert r.get("error") == "ConfigError" and str(home_b) in r["message"], r
        # weave-sbatch as A: exit 2 and one line naming the key; nothing stored
        before = len(call(sock, Op.STATUS, all=True)["jobs"])
        with scratch_dir("weave-mu-") as spec_dir:
            spec_file = spec_dir / "bad.toml"
            spec_file.write_text(path_spec("/etc/shadow", "data_file"))
            spec_file.chmod(0o644)
            r = as_user(a, lambda: run_app(sbatch_app, "weave-sbatch",
                                           [str(spec_file), "--socket", str(sock)]))
        assert r["ok"] == 2 and one_line(r["stderr"]), r
        assert "options.data_file" in r["stderr"] and "outside" in r["stderr"], r
        assert len(call(sock, Op.STATUS, all=True)["jobs"]) == before
    finally:
        for link in links:
            link.unlink(missing_ok=True)
        shutil.rmtree(own, ignore_errors=True)


def test_check_paths_site_roots_and_entry(tmp_path: Path,
                                          test_users: tuple[TestUser, TestUser]) -> None:
    a, _ = test_users
    job = parse_job(path_spec(f"{tmp_path}/out"), "s.toml")
    with pytest.raises(ConfigError, match="outside your own directories"):
        check_paths(job, a.uid)
    check_paths(job, a.uid, roots=[tmp_path])  # a site root allows it
    check_paths(parse_job(job_spec_toml("no-paths")), a.uid)  # nothing to check
    model_id = parse_job(path_spec("Qwen/Qwen2.5-7B", "model"))  # data, not a path
    check_paths(model_id, a.uid)
    with pytest.raises(ConfigError, match=r"key 'options\.model_dir'.*must be an absolute"):
        check_paths(parse_job(path_spec("Qwen/Qwen2.5-7B", "model_dir")), a.uid)
    for entry in ("/home/x/evil.py:run", "builtin:grpo-toy; touch /tmp/x", "os:system()",
                  "../x:y", "$(id):f"):
        with pytest.raises(ConfigError, match=r"key 'entry' .*builtin:<name>"):
            parse_job(job_spec_toml("e", entry=entry))
    assert parse_job(job_spec_toml("e", entry="pkg.mod:Factory")).entry == "pkg.mod:Factory"


# -- 6. names and arguments reach Slurm without shell interpretation ----------------------------

PWNED = Path(tempfile.gettempdir()) / f"weave-pwned-{os.getpid()}"
PAYLOADS = (f"$(touch {PWNED})", f"`touch {PWNED}`", f"x; touch {PWNED}",
            f"x\ntouch {PWNED}", f"x' && touch '{PWNED}", f'x" && touch "{PWNED}',
            f"x | touch {PWNED}", f"${{IFS}}touch${{IFS}}{PWNED}", f"x & touch {PWNED} #")


@pytest.fixture
def no_pwned() -> Iterator[None]:
    PWNED.unlink(missing_ok=True)
    yield
    assert not PWNED.exists(), "a shell ran a payload"


def test_names_with_shell_metacharacters_are_refused_in_one_line(
        weaved: Running, test_users: tuple[TestUser, TestUser], public_dir: Path,
        no_pwned: None,
        python_for_users: list[str]) -> None:
    a, _ = test_users
    sock = weaved.socket
    spec_file = public_dir / "job.toml"
    spec_file.write_text(job_spec_toml("fine"))
    spec_file.chmod(0o644)
    for i, payload in enumerate(PAYLOADS):
        r = as_user(a, lambda p=payload: call(sock, Op.SUBMIT,  # type: ignore[misc]
                                              spec=job_spec_toml(p),
                                              source=p))
        assert r.get("error") == "ConfigError" and one_line(r["message"]), (payload, r)
        assert "key 'name'" in r["message"] and "letters, digits" in r["message"], r
        # weave-sbatch: -J on the command line, #SBATCH -J and #WEAVE --job-name in a script
        script = public_dir / f"s{i}.sh"
        quoted = json.dumps(payload)
        script.write_text(f"#!/bin/bash\n#SBATCH -J {quoted}\n#WEAVE --model-params-b=1 "
                          "--rollout-gpus=8 --train-gpus=8 --max-tokens=64\n")
        script.chmod(0o644)
        script2 = public_dir / f"w{i}.sh"
        script2.write_text(script.read_text().replace("#SBATCH -J", "#WEAVE --job-name"))
        script2.chmod(0o644)
        for argv in ([str(spec_file), "-J", payload], [str(script)], [str(script2)]):
            r = as_user(a, lambda v=argv: run_app(sbatch_app, "weave-sbatch",  # type: ignore[misc]
                                                  [*v, "--socket", str(sock)]))
            assert r.get("ok") == 2 and one_line(r["stderr"]), (argv, r)
            assert "name" in r["stderr"] and r["stdout"] == "", r
    # the same payloads as data (options, source label) are stored verbatim, run nowhere
    spec = job_spec_toml("data", entry=OWN_ENTRY,
                         options={f"p{i}": p for i, p in enumerate(PAYLOADS)})
    job = as_user(a, lambda: call(sock, Op.SUBMIT, spec=spec, source=PAYLOADS[0]))["ok"]["job"]
    shown = as_user(a, lambda: call(sock, Op.SHOW, kind="job", id=job))["ok"]
    assert parse_job(shown["spec"]).options == tuple((f"p{i}", p)
                                                     for i, p in enumerate(PAYLOADS))
    assert shown["source"] == PAYLOADS[0]
    assert call(sock, Op.STATUS, all=True)["jobs"][0]["name"] != PAYLOADS[0]


class RecordingRunner(SubprocessRunner):
    """The real runner, keeping every argv it was given."""

    def __init__(self) -> None:
        self.argvs: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        self.argvs.append(tuple(argv))
        return super().run(argv, **kw)

    def spawn(self, argv: Sequence[str], **kw: Any) -> BackgroundProcess:
        self.argvs.append(tuple(argv))
        return super().spawn(argv, **kw)


def assert_no_shell(argvs: Sequence[tuple[str, ...]]) -> None:
    """Every command is a Slurm client run as an argv list, never a shell."""
    for argv in argvs:
        assert argv[0] in ("sbatch", "srun", "scancel", "squeue", "sinfo"), argv


@pytest.mark.slurm
def test_arguments_reach_a_slurm_step_verbatim(slurm_cluster: Any, public_dir: Path,
                                               no_pwned: None) -> None:
    """On the real cluster: payloads as step arguments arrive byte for byte."""
    runner = RecordingRunner()
    backend = SlurmCliBackend(runner=runner, env=slurm_cluster.env)
    alloc = backend.allocate(AllocationRequest(f"mu{os.getpid()}", "h20",
                                               (ResourceSpec("h20", 1, 1, "h20", 1),),
                                               time_limit_min=5))
    out = public_dir / "args.bin"
    try:
        handle = backend.launch_step(alloc.alloc_id, StepSpec(
            "args", (sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))",
                     *PAYLOADS), ntasks=1, log_path=out))
        wait_for(lambda: backend.poll_step(handle).state is not StepState.RUNNING, 60,
                 "the step ended")
        assert backend.poll_step(handle).state is StepState.COMPLETED, out.read_text()
        assert json.loads(out.read_text().strip().splitlines()[-1]) == list(PAYLOADS)
        srun = [a for a in runner.argvs if a[0] == "srun"]
        assert len(srun) == 1 and srun[0][-len(PAYLOADS):] == PAYLOADS
        assert_no_shell(runner.argvs)
    finally:
        backend.release(alloc.alloc_id)


@pytest.mark.slurm
def test_user_strings_never_reach_slurm_commands(slurm_cluster: Any, public_dir: Path,
                                                 test_users: tuple[TestUser, TestUser],
                                                 no_pwned: None) -> None:
    """weaved on the real cluster: a job whose options and source carry payloads runs;
    Slurm only ever sees weave's own names, and no command goes through a shell."""
    a, _ = test_users
    runner = RecordingRunner()
    instance = f"mu{os.getpid()}"
    cfg = DaemonConfig(state_dir=public_dir / "state", tick_s=0.2, backend="slurm",
                       instance=instance, node_command=("sleep", "infinity"),
                       client_timeout_s=5.0, env=dict(slurm_cluster.env))
    sock = cfg.socket
    with serving(cfg, SlurmCliBackend(runner=runner, env=slurm_cluster.env),
                 prefix=f"weave-g{instance}.") as w:
        wait_for(lambda: sock.exists(), 30, "weaved's socket")
        spec = job_spec_toml("data", entry=OWN_ENTRY,
                         options={f"p{i}": p for i, p in enumerate(PAYLOADS)})
        job = as_user(a, lambda: call(sock, Op.SUBMIT, spec=spec,
                                      source=PAYLOADS[1]))["ok"]["job"]
        wait_for(lambda: state_of(sock, job) == "RUNNING", 60, "running")
        names = {s.name for al in w.backend.list_allocations(f"weave-g{instance}.")
                 for s in w.backend.list_steps(al.alloc_id)}
        assert {f"weave-j{job}-h20-0", f"weave-j{job}-h800-0"} <= names, names
        assert call(sock, Op.CANCEL, jobs=[job])["results"][0]["ok"]
        wait_for(lambda: state_of(sock, job) == "CANCELLED", 60, "cancelled")
        flat = "\n".join("\0".join(argv) for argv in runner.argvs)
        assert runner.argvs and all(p not in flat for p in PAYLOADS)
        assert not any(s in flat for s in ("touch", "$(", "`"))
        assert_no_shell(runner.argvs)


def test_no_shell_in_the_package() -> None:
    """No ``shell=True``, ``os.system``/``os.popen`` or ``sh -c`` argv anywhere in
    weave_slurm (the node-daemon command is a plain argv; ``weave node serve`` expands
    ``{node}`` itself)."""
    import ast

    import weave_slurm

    root = Path(weave_slurm.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.keyword) and node.arg == "shell" and \
                    not (isinstance(node.value, ast.Constant) and node.value.value is False):
                found.append(f"{path.name}:{node.lineno} shell=")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "os" and node.attr in ("system", "popen", "execlp"):
                found.append(f"{path.name}:{node.lineno} os.{node.attr}")
            if isinstance(node, ast.Tuple | ast.List) and len(node.elts) >= 2 and \
                    all(isinstance(e, ast.Constant) for e in node.elts[:2]) and \
                    [e.value for e in node.elts[:2]] in (["sh", "-c"], ["bash", "-c"],  # type: ignore[attr-defined]
                                                         ["/bin/sh", "-c"]):
                found.append(f"{path.name}:{node.lineno} sh -c")
    assert found == [], found



# -- 7. the user's own code: what the workers need, checked as the user ----------------------

def _own(user: TestUser, top: Path) -> None:
    for path in (top, *top.rglob("*")):
        os.chown(path, user.uid, user.gid, follow_symlinks=False)


def test_a_job_whose_user_cannot_run_the_node_interpreter_is_refused_at_submit(
        rl_weaved: tuple[Weaved, Path, Path], test_users: tuple[TestUser, TestUser]) -> None:
    """The "No module named 'getpass'" case: a worker forked from the node daemon's
    zygote runs that zygote's interpreter as the job's uid, and imports modules lazily
    as that uid; an interpreter under a root-only directory fails it at run time. weaved
    refuses such a job at submit, in one line saying what to do."""
    a, _ = test_users
    _, sock, _ = rl_weaved
    if as_user(a, lambda: os.access(sys.executable, os.X_OK))["ok"]:
        pytest.skip(f"{sys.executable} is readable by other uids on this machine")
    before = len(call(sock, Op.STATUS, all=True)["jobs"])
    r = as_user(a, lambda: call(sock, Op.SUBMIT, spec=job_spec_toml("a-default"),
                                source="a.toml"))
    assert r.get("error") == "ConfigError" and one_line(r["message"]), r
    for needle in ("user weave-test-a cannot use the node interpreter", sys.executable,
                   "Permission denied", "No module named 'getpass'", "set 'python'"):
        assert needle in r["message"], (needle, r["message"])
    # the same through weave-sbatch: exit 2, one line, nothing stored
    with scratch_dir("weave-mu-") as spec_dir:
        spec_file = spec_dir / "a.toml"
        spec_file.write_text(job_spec_toml("a-default"))
        spec_file.chmod(0o644)
        # this VM's Python is closed to A too: import what the CLI imports lazily
        # (zoneinfo...) here first, where the forked child shares it
        run_app(sbatch_app, "weave-sbatch", [str(spec_file), "--socket", "/nowhere"])
        cli = as_user(a, lambda: run_app(sbatch_app, "weave-sbatch",
                                         [str(spec_file), "--socket", str(sock)]))
    assert cli.get("ok") == 2 and one_line(cli["stderr"]), cli
    assert "cannot use the node interpreter" in cli["stderr"], cli
    assert len(call(sock, Op.STATUS, all=True)["jobs"]) == before
    # root's own job (root can run the interpreter) is taken as before
    assert "job" in call(sock, Op.SUBMIT, spec=job_spec_toml("root-default"), source="r")


def test_code_paths_are_checked_as_the_user_not_as_root(
        weaved: Running, test_users: tuple[TestUser, TestUser],
        python_for_users: list[str]) -> None:
    """weaved (root) checks ``python``/``workdir``/``pythonpath`` as the submitter's uid:
    a path root can read and the user cannot is refused, naming the key and the value;
    weave-sbatch refuses it first, as the user."""
    from weave_slurm.daemon.access import NOT_A_DIR, Kind, Need, probe

    a, _ = test_users
    sock = weaved.socket
    home = Path(a.home)
    top = home / "code-check"
    shutil.rmtree(top, ignore_errors=True)
    (top / "venv" / "bin").mkdir(parents=True)
    (top / "src").mkdir()
    python = top / "venv" / "bin" / "python"     # an interpreter of A's own
    python.write_text(f"#!/bin/sh\nexec {sys.base_prefix}/bin/python3 \"$@\"\n")
    python.chmod(0o755)
    _own(a, top)
    closed = home / "closed"           # root's, 0700: root reads it, A cannot
    closed.mkdir(mode=0o700, exist_ok=True)
    (closed / "python").write_text("#!/bin/sh\n")
    (closed / "python").chmod(0o755)
    try:
        def spec(**code: Any) -> str:   # no torch in that python: an own, light entry
            return job_spec_toml("a-code", entry=OWN_ENTRY, **code)
        good = {"workdir": str(top), "python": str(python), "pythonpath": [str(top / "src")]}
        assert "job" in as_user(a, lambda: call(sock, Op.SUBMIT, spec=spec(**good),
                                                source="a"))["ok"]
        refused = [
            ({"python": f"{closed}/python"}, f"key 'python' = '{closed}/python': you "
             "cannot read and execute it (Permission denied)"),
            ({"workdir": str(closed)}, f"key 'workdir' = '{closed}': you cannot list and "
             "search it (Permission denied)"),
            ({"pythonpath": [str(top / "src"), str(top / "gone")]},
             f"key 'pythonpath[1]' = '{top}/gone': does not exist"),
            ({"workdir": str(python)}, f"key 'workdir' = '{python}': is not a directory"),
        ]
        for code, needle in refused:
            r = as_user(a, lambda c=code: call(sock, Op.SUBMIT,  # type: ignore[misc]
                                               spec=spec(**c), source="a"))
            assert r.get("error") == "ConfigError" and needle in r["message"], (code, r)
            assert one_line(r["message"]), r
        # the kernel's answer as A and as root (what the two doors ask)
        needs = [Need("python", f"{closed}/python", Kind.PROGRAM),
                 Need("workdir", str(top), Kind.DIR), Need("x", str(python), Kind.DIR)]
        assert probe(needs, a.uid) == [errno.EACCES, 0, NOT_A_DIR]
        assert probe(needs) == [0, 0, NOT_A_DIR]
        # weave-sbatch as A: refused before weaved is asked
        with scratch_dir("weave-mu-") as spec_dir:
            spec_file = spec_dir / "a.toml"
            spec_file.write_text(spec())
            spec_file.chmod(0o644)
            cli = as_user(a, lambda: run_app(sbatch_app, "weave-sbatch", [
                str(spec_file), "--test-only", "--python", f"{closed}/python"]))
        assert cli["ok"] == 2 and one_line(cli["stderr"]), cli
        assert f"key 'python' = '{closed}/python': you cannot read and execute" \
            in cli["stderr"], cli
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(closed, ignore_errors=True)


def test_output_files_are_checked_as_the_user_at_submission(
        weaved: Running, test_users: tuple[TestUser, TestUser]) -> None:
    """``-o /root/evil.out`` as another user is refused at submission (it used to be
    accepted and FAIL once it ran), by weaved as the user and first by weave-sbatch;
    a file of the user's own is taken."""
    from weave_slurm.daemon.access import NOT_A_FILE, Kind, Need, probe

    a, _ = test_users
    sock = weaved.socket
    spec = job_spec_toml("a-out")
    bad = [("/root/evil.out", "key 'slurm.output' = '/root/evil.out': you cannot write "
            "it, or create it in its directory"),
           ("/nonexistent-dir/x.out", "its directory does not exist")]
    for path, needle in bad:
        r = as_user(a, lambda p=path: call(sock, Op.SUBMIT,  # type: ignore[misc]
                                           spec=spec + f'\n[slurm]\noutput = "{p}"\n',
                                           source="a"))
        assert r.get("error") == "ConfigError" and needle in r["message"], r
        assert one_line(r["message"]), r
    ok = as_user(a, lambda: call(sock, Op.SUBMIT, spec=spec + f'\n[slurm]\noutput = '
                                 f'"{a.home}/%x-%j.out"\nerror = "e-%j.err"\n', source="a"))
    assert "job" in ok["ok"], ok            # in A's home; a relative one: there too
    assert probe([Need("o", "/root", Kind.LOG)]) == [NOT_A_FILE]
    import zoneinfo  # noqa: F401  (typer's pydantic imports it late; A cannot read root's)

    with scratch_dir("weave-mu-") as spec_dir:
        spec_file = spec_dir / "a.toml"
        spec_file.write_text(spec)
        spec_file.chmod(0o644)
        cli = as_user(a, lambda: run_app(sbatch_app, "weave-sbatch", [
            str(spec_file), "--test-only", "-o", "/root/evil.out"]))
    assert cli.get("ok") == 2 and "key 'slurm.output' = '/root/evil.out'" in cli["stderr"], cli


@pytest.mark.torch
def test_a_users_own_python_runs_their_job_where_the_node_interpreter_is_closed(
        rl_weaved: tuple[Weaved, Path, Path], test_users: tuple[TestUser, TestUser]) -> None:
    """weaved's (and the node daemons') interpreter is under a root-only directory; A's
    job names A's own venv (torch there, weave not): its zygote runs as A with that
    interpreter, and the job completes."""
    from tests.runtime.own_code import imports_weave, second_venv, seen, user_package

    a, _ = test_users
    _, sock, _ = rl_weaved
    if as_user(a, lambda: os.access(sys.executable, os.X_OK))["ok"]:
        pytest.skip(f"{sys.executable} is readable by other uids on this machine")
    top = Path(a.home) / "own-python"
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir()
    try:
        src, python = user_package(top / "code"), second_venv(top / "env")
        work = top / "work"
        work.mkdir()
        _own(a, top)
        assert not imports_weave(python)
        spec = job_spec_toml("a-own", entry="my_pkg.job:make", seed=5, iterations=2,
                             options={"prompts_per_step": 4, "group_size": 4},
                             workdir=str(work), python=str(python), pythonpath=[str(src)])
        job = as_user(a, lambda: call(sock, Op.SUBMIT, spec=spec, source="a"))["ok"]["job"]
        wait_for(lambda: state_of(sock, job) in ("COMPLETED", "FAILED"), 240, "A's job ended")
        row = call(sock, Op.STATUS, jobs=[job], all=True)["jobs"][0]
        assert row["state"] == "COMPLETED", row
        records = seen(work)
        assert len(records) >= 2, records
        assert {(r["executable"], r["uid"], r["cwd"]) for r in records} == \
            {(str(python), a.uid, str(work))}
    finally:
        shutil.rmtree(top, ignore_errors=True)
