"""Whether a submitted job would run as declared: checked at submission, never replaced.

weaved runs what a spec says or refuses it here, in one line naming the key (exit 2 on
the client), before anything is stored or allocated:

- a hosted job (no ``[launch]``) must name its ``entry``: a spec without one is a
  planning-only spec (``weave plan``, ``weave simulate``), never run as some other job;
- a layout of more than one training rank or rollout engine needs a site that starts
  them all (``[runtime] gangs``); a site that starts one process per role refuses it
  instead of running fewer;
- a built-in entry must exist and accept the spec (its algorithm, its ``[options]``
  against the layout, its extra installed: :mod:`weave_slurm.workloads.builtins`);
- a ``package.module:factory`` entry must import in the job's own environment (its
  ``python``, ``pythonpath``, ``workdir``), as the job's uid: :func:`probe_entry` runs
  that interpreter as the user and imports the module, as the workers will.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.config.job import SHOWN_CHARS, JobSpec
from weave_slurm.config.site import SiteConfig
from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import MemberLayout, single_layout
from weave_slurm.workloads.builtins import builtin, check_builtin, is_builtin

#: How long the import of a job's own entry may take at submission (torch and the
#: job's framework imported on a loaded login node: seconds; a hung mount: refused).
PROBE_TIMEOUT_S = 60.0

#: Runs in the job's interpreter as its uid: finds modules, imports ``module:attr``.
_PROBE = """\
import importlib, importlib.util, json, sys
mods, entry, path = json.loads(sys.argv[1])
for p in reversed(path):
    sys.path.insert(0, p)
out = {"missing": [m for m in mods if importlib.util.find_spec(m) is None]}
if entry:
    mod, _, attr = entry.partition(":")
    try:
        target = importlib.import_module(mod)
        for part in attr.split("."):
            target = getattr(target, part)
        if not callable(target):
            out["error"] = f"{attr!r} is not callable"
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
sys.stdout.write("\\n" + json.dumps(out) + "\\n")
"""


def check_runnable(job: JobSpec, layout: MemberLayout | None, site: SiteConfig,
                   uid: int, node_python: str | None) -> None:
    """Refuse (ConfigError, one line) a job weaved would not run as declared;
    ``node_python``: the interpreter the node daemons fork default workers from
    (None: a site's own node command, not known here)."""
    if job.launch is not None:
        return      # a cooperative job runs its own commands
    if job.entry is None:
        raise ConfigError(f"{job.source}: no 'entry': a planning-only spec (weave plan, "
                          "weave simulate); to run it, name its RL job: entry = "
                          "'builtin:<name>' or 'package.module:factory' (docs/job_api.md)")
    if layout is not None and not site.runtime.gangs and \
            (layout.train.ranks > 1 or layout.rollout.engines > 1):
        raise ConfigError(f"{job.source}: its layout is {layout.words()} but site "
                          f"{site.source} starts one process per role ([runtime] gangs = "
                          "false): set gpus.train = 1 and gpus.rollout = 1, or run it on a "
                          "site with gangs = true")
    if job.slurm.container is not None:
        return      # its interpreter is the image's: not probed from here
    python = job.python or node_python
    if is_builtin(job.entry):
        b = builtin(job.entry, job.source)
        here = python is not None and os.path.realpath(python) == \
            os.path.realpath(sys.executable)
        check_builtin(job, layout or single_layout(), installed=here)
        if python is None or here:
            return
        modules, entry = b.modules, None
    else:
        if python is None:
            return      # a site's own node command: its interpreter is not known here
        modules, entry = (), job.entry
    found = probe_entry(Probe(python, modules, entry, job.pythonpath, job.workdir), uid)
    _refuse(job, found, python)


@dataclass(frozen=True)
class Probe:
    """What to look up in the job's interpreter: ``modules`` found, ``entry`` imported."""

    python: str
    modules: tuple[str, ...]
    entry: str | None
    pythonpath: tuple[str, ...] = ()
    workdir: str | None = None


@dataclass(frozen=True)
class Found:
    missing: tuple[str, ...] = ()
    error: str | None = None


def probe_entry(probe: Probe, uid: int | None = None) -> Found:
    """Run ``probe.python`` as ``uid`` (None or this process's: as it is) in the job's
    working directory, import weave as the workers do, and report."""
    args = json.dumps([list(probe.modules), probe.entry, list(probe.pythonpath)])
    how: dict[str, object] = {}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONSAFEPATH"] = "1"
    if os.path.realpath(probe.python) != os.path.realpath(sys.executable):
        env["PYTHONPATH"] = str(_weave_link())      # as a job interpreter's zygote
    if uid is not None and uid != os.geteuid():
        if os.geteuid() != 0:
            return Found()      # cannot become that uid (daemon/access.py): not checked
        user = _user(uid)
        how.update(user=uid, group=user.pw_gid if user else uid, extra_groups=[])
        if user is not None:
            env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    cwd = probe.workdir or env.get("HOME") or "/"
    try:
        res = subprocess.run([probe.python, "-c", _PROBE, args], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                             stdin=subprocess.DEVNULL, **how)  # type: ignore[call-overload]
    except subprocess.TimeoutExpired:
        return Found(error=f"the import did not finish in {PROBE_TIMEOUT_S:g} s")
    except OSError as exc:
        return Found(error=f"cannot run {probe.python}: {exc.strerror or exc}")
    last = res.stdout.strip().splitlines()[-1:] if res.stdout.strip() else []
    try:
        out = json.loads(last[0]) if last else None
    except ValueError:
        out = None
    if not isinstance(out, dict):
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1][:SHOWN_CHARS]
        return Found(error=f"{probe.python} exited {res.returncode}: {tail}")
    return Found(tuple(out.get("missing") or ()), out.get("error"))


def _refuse(job: JobSpec, found: Found, python: str) -> None:
    assert job.entry is not None
    env = (f"python {python}" + (f", pythonpath {list(job.pythonpath)}"
                                 if job.pythonpath else "")
           + (f", workdir {job.workdir}" if job.workdir else ""))
    if found.missing:
        b = builtin(job.entry)
        raise ConfigError(f"{job.source}: key 'entry' = {job.entry!r} needs "
                          f"{', '.join(found.missing)}, not installed for the job's "
                          f"workers ({env}): pip install 'weave-slurm[{b.extra}]' there")
    if found.error is not None:
        raise ConfigError(f"{job.source}: key 'entry' = {job.entry!r} cannot be imported "
                          f"by the job's workers ({env}): {found.error}; set 'pythonpath' "
                          "to the directory holding your package (docs/job_api.md, "
                          "'Your own code')")


def _user(uid: int) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


def _weave_link() -> Path:
    from weave_slurm.node.zygotes import link_dir

    root = Path(tempfile.gettempdir()) / f"weave-probe-{os.geteuid()}"
    root.mkdir(mode=0o755, exist_ok=True)
    return link_dir(root)
