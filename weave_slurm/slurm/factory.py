"""Pick a backend by name: ``local`` (default, no Slurm), ``slurm`` (CLI), ``pyslurm``.

pyslurm is accepted only if it imports AND its major.minor version equals the
running Slurm's (pyslurm's versions track Slurm's); there is no pyslurm
implementation yet, so even a matching pyslurm is refused with the reason.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Mapping
from pathlib import Path

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.backend import Backend
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.cluster_config import ClusterLayout
from weave_slurm.slurm.command_runner import CommandRunner, SlurmCommandError, SubprocessRunner
from weave_slurm.slurm.local_backend import LocalBackend
from weave_slurm.slurm.templates import ALLOCATION_TEMPLATE, check_allocation_template

_VERSION_RE = re.compile(r"(\d+)\.(\d+)")


class BackendKind(enum.Enum):
    LOCAL = "local"
    SLURM = "slurm"
    PYSLURM = "pyslurm"


def _major_minor(text: str) -> tuple[int, int] | None:
    m = _VERSION_RE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def slurm_version(runner: CommandRunner, env: Mapping[str, str] | None = None) -> str:
    """The running Slurm's version as ``sinfo --version`` prints it (e.g. ``22.05.8``)."""
    out = runner.run(["sinfo", "--version"], timeout_s=10, env=env).stdout
    return out.strip().split()[-1] if out.strip() else ""


def check_pyslurm(runner: CommandRunner, env: Mapping[str, str] | None = None) -> str:
    """Why pyslurm cannot be used here (always a reason today; see module doc)."""
    try:
        mod = importlib.import_module("pyslurm")
    except ImportError as exc:
        return f"pyslurm does not import ({exc})"
    version = str(getattr(mod, "__version__", "") or getattr(mod, "version", lambda: "")())
    try:
        running = slurm_version(runner, env)
    except SlurmCommandError as exc:
        return f"cannot read the running Slurm version ({exc})"
    if _major_minor(version) != _major_minor(running):
        return f"pyslurm {version!r} does not match the running Slurm {running!r}"
    return f"pyslurm {version!r} matches Slurm {running!r} but has no backend yet"


def make_backend(kind: str | BackendKind = BackendKind.LOCAL, *,
                 state_dir: Path = Path(".state/local"), layout: ClusterLayout | None = None,
                 env: Mapping[str, str] | None = None, runner: CommandRunner | None = None,
                 log_dir: Path | None = None, template: Path | None = None) -> Backend:
    """The backend named ``kind``; ConfigError naming the valid kinds otherwise.
    ``template``: a site's allocation script for ``slurm`` (checked here; None: the
    shipped one)."""
    try:
        which = BackendKind(kind)
    except ValueError:
        valid = [k.value for k in BackendKind]
        raise ConfigError(f"backend {kind!r} is unknown; valid: {valid}") from None
    if which is BackendKind.LOCAL:
        return LocalBackend(state_dir, layout)
    runner = runner or SubprocessRunner()
    if which is BackendKind.SLURM:
        if template is not None:
            check_allocation_template(template)
        return SlurmCliBackend(runner=runner, env=env, log_dir=log_dir,
                               template=template or ALLOCATION_TEMPLATE)
    reason = check_pyslurm(runner, env)
    raise ConfigError(f"backend 'pyslurm' refused: {reason}; use backend 'slurm' (the CLI "
                      "with --json) instead")
