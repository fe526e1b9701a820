"""Render the scripts in ``weave_slurm/templates/`` (a group's allocation as an sbatch job).

Templates use ``@@{name}`` placeholders (a :class:`string.Template` with delimiter
``@@``) so shell ``$VAR`` and ``${VAR}`` pass through untouched. Rendering is
strict: a placeholder without a value, or a value without a placeholder, is an
error.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.backend import AllocationRequest
from weave_slurm.slurm.cli_backend import component_args

#: Package data (``weave_slurm/templates/``), so an installed wheel finds them too.
TEMPLATE_DIR = Path(str(files("weave_slurm") / "templates"))


class _Template(string.Template):
    delimiter = "@@"


def render(name: str, values: Mapping[str, str], template_dir: Path = TEMPLATE_DIR) -> str:
    """Fill template ``name`` with ``values``; ConfigError on any mismatch."""
    path = template_dir / name
    try:
        tpl = _Template(path.read_text())
    except OSError as exc:
        have = sorted(p.name for p in template_dir.glob("*")) if template_dir.is_dir() else []
        raise ConfigError(f"template {str(path)!r} cannot be read ({exc.strerror}); "
                          f"available: {have}") from exc
    wanted = set(tpl.get_identifiers())
    missing, extra = wanted - set(values), set(values) - wanted
    if missing or extra:
        raise ConfigError(f"template {name!r}: missing values {sorted(missing)}, unknown "
                          f"values {sorted(extra)}; placeholders are {sorted(wanted)}")
    return tpl.substitute(values)


def render_allocation(request: AllocationRequest, output: str = "/dev/null",
                      template_dir: Path = TEMPLATE_DIR) -> str:
    """The sbatch script that holds a group's allocation (one ``hetjob`` per component)."""
    request.validate()
    blocks = []
    for i, comp in enumerate(request.components):
        if i:
            blocks.append("#SBATCH hetjob")
        blocks += [f"#SBATCH {flag}" for flag in component_args(comp)]
    time_line = (f"#SBATCH --time={request.time_limit_min}" if request.time_limit_min
                 else "# (no time limit: the partition's limit applies)")
    for flag, value in (("account", request.account), ("qos", request.qos)):
        if value is not None:
            time_line += f"\n#SBATCH --{flag}={value}"
    return render("allocation.sbatch", {
        "pool": request.pool, "group_id": request.group_id, "job_name": request.job_name,
        "comment": request.comment, "output": output, "time_directive": time_line,
        "component_directives": "\n".join(blocks)}, template_dir)
