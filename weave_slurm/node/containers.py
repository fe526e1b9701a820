"""A job's processes inside its container: the node daemon runs the site's OCI runtime.

A job's processes (a cooperative role's, node/gate_ops.py; a hosted job's zygote and
the resident workers it forks, node/zygotes.py) are the node daemon's children, not
Slurm steps, so Slurm's ``srun --container`` cannot wrap them; the node daemon does
what slurmstepd does for a step's task, with the same ``oci.conf`` (config/oci.py): it
writes a bundle of the launch's own (``config.json`` only) whose

- ``root.path`` is the job's bundle's ``rootfs`` (absolute; its ``readonly`` kept);
- ``process`` is the launch's argv, its environment, working directory and the job's
  uid, gid and groups (as slurmstepd sets a task's), no terminal;
- ``mounts`` are the bundle's, plus bind mounts of what the process needs from the node
  (:func:`binds`): this daemon's socket directory (the gate), ``/dev/shm`` (the node's
  warm state, instead of the bundle's private tmpfs), the working directory (and a
  hosted job's output files' directories), and weave's own import path (read-only)
  with ``PYTHONPATH`` naming it, so the container's ``python3.11`` imports
  ``weave_slurm`` (and torch, and the job's ``pythonpath``) as the node's does; the
  container's interpreter must be the same minor version;
- for a zygote, no pid namespace (``host_pids``): the pool follows its workers by pid;

then runs ``RunTimeRun`` with ``%b`` that bundle, and ``RunTimeDelete`` once the process
has ended (:func:`remove`). The bundle's other namespaces are kept as written: a bundle
for jobs that talk between nodes shares the host's network (no ``network`` namespace),
as HPC images do.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weave_slurm.config.oci import OciConf, bundle_problem, runtime_argv
from weave_slurm.errors import ConfigError

log = logging.getLogger(__name__)

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.+-]")
#: Longest wait for ``RunTimeDelete``.
DELETE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Bind:
    path: str
    writable: bool

    def to_json(self) -> dict[str, Any]:
        return {"destination": self.path, "type": "bind", "source": self.path,
                "options": ["rbind", "rw" if self.writable else "ro"]}


def weave_import_path() -> list[str]:
    """This interpreter's import path outside its own standard library (weave's package,
    the venv's site-packages and what its .pth files add), existing directories only."""
    base = (os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix))
    out: list[str] = []
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real not in ("", "/") and os.path.isdir(real) and not real.startswith(base) \
                and entry not in out:
            out.append(os.path.abspath(entry))
    return out


def binds(*, socket_dir: str, workdir: str | None, pythonpath: Sequence[str],
          import_path: Sequence[str], writable: Sequence[str] = ()) -> list[Bind]:
    """What a process needs from the node (module doc), each once, parents first;
    ``writable``: more directories it writes (a hosted job's output files')."""
    wanted = [Bind(socket_dir, True), Bind("/dev/shm", True)]
    wanted += [Bind(p, True) for p in [*filter(None, [workdir]), *writable]]
    wanted += [Bind(p, False) for p in [*pythonpath, *import_path]]
    seen: dict[str, Bind] = {}
    for b in wanted:
        if os.path.isabs(b.path) and os.path.isdir(b.path) and os.path.normpath(b.path) != "/":
            seen.setdefault(os.path.normpath(b.path), b)
    return sorted(seen.values(), key=lambda b: b.path.count("/"))


def launch_config(bundle: str, *, args: Sequence[str], env: Mapping[str, str], cwd: str,
                  uid: int, gid: int, groups: Sequence[int], mounts: Sequence[Bind],
                  host_pids: bool = False) -> dict[str, Any]:
    """The launch's ``config.json``: the job bundle's, with the process and mounts above
    (``host_pids``: without the bundle's pid namespace)."""
    why = bundle_problem(bundle)
    if why:
        raise ConfigError(f"container {bundle!r}: {why}")
    try:
        config = json.loads((Path(bundle) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"container {bundle!r}: cannot read its config.json: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"container {bundle!r}: its config.json is no JSON object")
    root, process = (_table(config, k) for k in ("root", "process"))
    config["root"] = {**root, "path": os.path.join(bundle, "rootfs")}
    config["process"] = {**process, "terminal": False, "args": list(args), "cwd": cwd,
                         "env": [f"{k}={v}" for k, v in env.items()],
                         "user": {"uid": uid, "gid": gid,
                                  "additionalGids": [g for g in groups if g != gid]}}
    ours = {m.path for m in mounts}
    kept = [m for m in config.get("mounts") or []
            if not (isinstance(m, dict) and m.get("destination") in ours)]
    config["mounts"] = kept + [m.to_json() for m in mounts]
    linux = _table(config, "linux")
    if host_pids and isinstance(linux.get("namespaces"), list):
        linux["namespaces"] = [n for n in linux["namespaces"]
                               if not (isinstance(n, dict) and n.get("type") == "pid")]
        config["linux"] = linux
    return config


def _table(config: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    return dict(value) if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Launch:
    """How to start one role's process in its container, and what to do after it ended."""

    argv: list[str]                  # RunTimeRun, filled in
    delete: list[str] | None         # RunTimeDelete, filled in (None: not configured)
    bundle_dir: Path                 # the launch's own bundle (removed after the delete)


def shell_args(bundle: str, command: str) -> list[str]:
    """``command`` run by the container's ``/bin/bash`` (else ``/bin/sh``)."""
    bash = os.path.exists(os.path.join(bundle, "rootfs", "bin", "bash"))
    return ["/bin/bash" if bash else "/bin/sh", "-c", command]


def prepare(conf: OciConf, bundle: str, bundle_dir: Path, *, args: Sequence[str],
            env: Mapping[str, str], workdir: str, uid: int, gid: int, groups: Sequence[int],
            socket_dir: str, names: Mapping[str, str], writable: Sequence[str] = (),
            host_pids: bool = False) -> Launch:
    """Write the launch's bundle for ``args`` (in ``workdir``) and say how to run it
    (module doc). ``names``: ``n u j s t`` of the runtime's patterns."""
    why = conf.problem()
    if why:
        raise ConfigError(f"container {bundle!r}: {why}")
    ours = weave_import_path()
    given = [p for p in env.get("PYTHONPATH", "").split(":") if p]
    inside = {**env, "PYTHONPATH": ":".join([*given, *(p for p in ours if p not in given)])}
    mounts = binds(socket_dir=socket_dir, workdir=workdir, pythonpath=given, import_path=ours,
                   writable=writable)
    config = launch_config(bundle, args=args, env=inside, cwd=workdir, uid=uid, gid=gid,
                           groups=groups, mounts=mounts, host_pids=host_pids)
    write_bundle(bundle_dir, config)
    values = {**{k: _NAME_BAD.sub("_", v) for k, v in names.items()},
              "b": str(bundle_dir), "r": os.path.join(bundle, "rootfs"), "U": str(uid)}
    delete = runtime_argv(conf.delete, values) if conf.delete else None
    return Launch(runtime_argv(conf.run or "", values), delete, bundle_dir)


def remove(launch: Launch) -> None:
    """After the process ended: ``RunTimeDelete`` (the runtime's record of the container),
    then the launch's bundle. Best effort: a failure is logged, never raised."""
    if launch.delete is not None:
        try:
            done = subprocess.run(launch.delete, capture_output=True, timeout=DELETE_TIMEOUT_S,
                                  check=False)
            if done.returncode:
                log.warning("%s: exit %d: %s", " ".join(launch.delete), done.returncode,
                            done.stderr.decode(errors="replace").strip()[-300:])
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s: %s", " ".join(launch.delete), exc)
    shutil.rmtree(launch.bundle_dir, ignore_errors=True)


def write_bundle(bundle_dir: Path, config: Mapping[str, Any]) -> Path:
    """The launch's bundle directory: its ``config.json`` (root-only)."""
    bundle_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = bundle_dir / "config.json"
    path.write_text(json.dumps(config, indent=1) + "\n")
    return bundle_dir
