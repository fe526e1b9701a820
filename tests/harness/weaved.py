"""weaved in tests: served on a thread of this process, stopped with nothing left in
its backend, and the calls the tests make on its socket."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.waits import wait_for
from weave_slurm.daemon.client import DaemonClient
from weave_slurm.daemon.driver import DriverKind
from weave_slurm.daemon.job_output import log_files
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.daemon.store import Store
from weave_slurm.errors import WeaveError
from weave_slurm.slurm.backend import Backend, StepHandle


def call(sock: Path, op: Op, **args: Any) -> dict[str, Any]:
    """One request to the weaved at ``sock``, on a connection of its own."""
    with DaemonClient(sock) as client:
        return dict(client.call(op, **args))


def recoveries(sock: Path, job: int) -> int:
    """How many times weaved's runtime has recovered ``job`` (``weave show job``)."""
    shown = call(sock, Op.SHOW, kind="job", id=job)
    return int((shown.get("runtime") or {}).get("recoveries") or 0)


def pings(sock: Path) -> bool:
    """True if a weaved answers on ``sock`` now (a probe: no wait for one starting)."""
    try:
        with DaemonClient(sock, wait_s=0) as client:
            client.call(Op.PING)
    except (WeaveError, OSError):
        return False
    return True


def state_of(sock: Path, job: int) -> str:
    return str(call(sock, Op.STATUS, jobs=[job])["jobs"][0]["state"])


def active_groups(sock: Path, ids: list[int], timeout_s: float) -> list[dict[str, Any]]:
    """weaved's ACTIVE groups once every job of ``ids`` is a member of one. Each
    submission is an arrival of its own: under load a group may start with the first
    before the others are placed (they join it then), so waiting for any ACTIVE group
    would read it too early."""
    def placed() -> list[dict[str, Any]]:
        groups = [g for g in call(sock, Op.GROUPS)["groups"] if g["state"] == "ACTIVE"]
        return groups if {j for g in groups for j in g["members"]} >= set(ids) else []
    return list(wait_for(placed, timeout_s, f"jobs {ids} in active groups",
                         interval_s=0.3))


def wait_states(sock: Path, ids: list[int], want: set[str], timeout_s: float,
                seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The status rows of ``ids`` once every one is in a state of ``want``; every row
    polled on the way is appended to ``seen``."""
    def rows() -> list[dict[str, Any]]:
        got = list(call(sock, Op.STATUS, jobs=ids)["jobs"])
        seen.extend(got)
        return got
    return wait_for(rows, timeout_s, f"jobs {ids} in {sorted(want)}", interval_s=0.3,
                    until=lambda got: all(r["state"] in want for r in got))


def smoke_site(text: str = "") -> str:
    """A test site's TOML as a CPU smoke site: its partitions declare GPUs its hosts lack,
    so a member trains as one process (``[runtime] gangs = false``) unless the test says
    ``gangs`` itself (the gang tests: tests/runtime/test_gang_run.py, test_gang_hosts.py)."""
    if re.search(r"^gangs\s*=", text, re.M):
        return text
    if re.search(r"^\[runtime\]\s*$", text, re.M):
        return re.sub(r"^\[runtime\]\s*$", "[runtime]\ngangs = false", text, count=1,
                      flags=re.M)
    return f"{text.rstrip()}\n\n[runtime]\ngangs = false\n".lstrip()


def rl_config(public: Path, shm: Path, **more: Any) -> DaemonConfig:
    """weaved with the group runtime (real node daemons and workers) on the LocalBackend
    (without ``site_path``: the built-in site, whose members train as one process)."""
    return DaemonConfig(state_dir=public / "state", tick_s=0.2, shm_root=shm,
                        client_timeout_s=5.0, runtime=DriverKind.RL, **more)


@contextmanager
def rl_site(prefix: str, site: str) -> Iterator[DaemonConfig]:
    """:func:`rl_config` on the smoke site of ``site`` (its TOML), in a public dir and a
    /dev/shm dir of their own (removed at the end)."""
    with public_dir(prefix) as public, shm_dir(prefix) as shm:
        (public / "site.toml").write_text(smoke_site(site))
        yield rl_config(public, shm, site_path=public / "site.toml")


@dataclass
class Served:
    """A Weaved whose :meth:`~Weaved.run` loop runs on a thread of this process."""

    weaved: Weaved
    thread: threading.Thread

    def stop(self, join_s: float = 30.0) -> None:
        self.weaved.stop()
        self.thread.join(timeout=join_s)


def serve(cfg: DaemonConfig, backend: Backend | None = None) -> Served:
    w = Weaved(cfg, backend=backend)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    return Served(w, thread)


def stop_released(served: Served) -> None:
    """Stop ``served`` and release every allocation of its backend."""
    served.stop()
    release_all(served.weaved.backend)


def release_all(backend: Backend, prefix: str = "", instance: str | None = None) -> None:
    """Cancel the steps of every allocation named ``prefix...`` (and, given
    ``instance``, tagged as that weaved's: membership.instance_tag) and release it."""
    for alloc in backend.list_allocations(prefix, instance=instance):
        for step in backend.list_steps(alloc.alloc_id):
            backend.cancel_step(StepHandle(alloc.alloc_id, step.name, 0))
        backend.release(alloc.alloc_id)


@contextmanager
def serving(cfg: DaemonConfig, backend: Backend | None = None, *, prefix: str = "",
            join_s: float = 30.0) -> Iterator[Weaved]:
    """A served weaved; at the end it is stopped and its allocations (``prefix...``:
    on a shared Slurm, this instance's) are released."""
    served = serve(cfg, backend)
    try:
        yield served.weaved
    finally:
        served.stop(join_s)
        release_all(served.weaved.backend, prefix)
        remove_default_outputs(cfg.state_dir / "weaved.db")


def remove_default_outputs(db: Path) -> None:
    """Remove the ``weave-%j.out`` files that this weaved's jobs naming neither an
    ``--output`` nor a ``workdir`` wrote in their user's home (weave's default, as
    sbatch's ``slurm-%j.out``): a test leaves no file in a real home."""
    if not db.exists():
        return
    try:
        store = Store(db)
    except (WeaveError, sqlite3.Error):   # a test's damaged or foreign file: none to read
        return
    try:
        for job in store.jobs():
            out, spec = log_files(job)[0], job.spec
            if out and spec is not None and spec.slurm.output is None and spec.workdir is None:
                Path(out).unlink(missing_ok=True)
    finally:
        store.close()


@contextmanager
def serving_on_slurm(cfg: DaemonConfig) -> Iterator[Weaved]:
    """weaved on the session's Slurm cluster (``cfg.env`` names it; the CLI backend), once
    its socket is there. At the end it is stopped and this instance's
    allocations released (``weave-g<instance>.``)."""
    from weave_slurm.slurm.cli_backend import SlurmCliBackend

    with serving(cfg, SlurmCliBackend(env=dict(cfg.env or {})),
                 prefix=f"weave-g{cfg.instance}.") as w:
        wait_for(w.config.socket.exists, 30, "weaved's socket", interval_s=0.1)
        yield w


def idle_on_slurm(state_dir: Path, instance: str, env: dict[str, str],
                  site: Path | None = None) -> DaemonConfig:
    """A weaved of the idle driver on the session's Slurm cluster: its allocations are
    real, its node-daemon steps sleep (tests of what weaved asks Slurm for)."""
    return DaemonConfig(state_dir=state_dir, backend="slurm", instance=instance,
                        site_path=site, tick_s=0.3, env=env,
                        node_command=("sleep", "infinity"), runtime=DriverKind.IDLE,
                        client_timeout_s=5.0)


def rl_on_slurm(dirs: Any, instance: str, env: dict[str, str],
                shared: Path, site: Path | None = None) -> DaemonConfig:
    """A weaved of the group runtime on the session's Slurm cluster of separate hosts:
    its state on the login side (``dirs.state``), checkpoints on the shared root, job
    paths under ``shared``."""
    return DaemonConfig(state_dir=dirs.state, backend="slurm", instance=instance, tick_s=0.3,
                        runtime=DriverKind.RL, client_timeout_s=5.0, env=env,
                        checkpoint_root=dirs.ckpt, path_roots=(shared,), site_path=site)
