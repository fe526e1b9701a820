"""Render the allocation template (``sbatch_templates/allocation.sbatch``): a group's
allocation as the sbatch job weaved submits.

The template ships in the wheel (``weave_slurm/sbatch_templates/``, the repository's
top-level ``sbatch_templates/``); a site may put its own in place with ``[slurm]
allocation_template`` (docs/deploy.md). Templates use ``@@{name}`` placeholders (a
:class:`string.Template` with delimiter ``@@``) so shell ``$VAR`` and ``${VAR}`` pass
through untouched. Rendering is strict: a placeholder without a value, or a value
without a placeholder, is an error. The script must keep running while the group runs:
when it ends, Slurm ends the allocation with it.
"""

from __future__ import annotations

import shlex
import string
import sys
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.backend import AllocationRequest, ResourceSpec

#: Package data (``weave_slurm/sbatch_templates/``), so an installed wheel finds them too.
TEMPLATE_DIR = Path(str(files("weave_slurm") / "sbatch_templates"))
ALLOCATION_TEMPLATE = TEMPLATE_DIR / "allocation.sbatch"
#: Every placeholder the allocation template must use: the name and comment are how a
#: restarted weaved finds its allocations, the component lines what Slurm gives.
ALLOCATION_PLACEHOLDERS = frozenset({"pool", "group_id", "job_name", "comment", "output",
                                     "time_directive", "component_directives",
                                     "hold_command"})
#: What holds the nodes (the script's last line): ``weave node hold`` with weaved's own
#: interpreter, which the nodes run weave with (as the node daemons).
HOLD_ARGV = (sys.executable, "-m", "weave_slurm.cli.node", "hold")


class _Template(string.Template):
    delimiter = "@@"


def component_args(spec: ResourceSpec) -> list[str]:
    """The sbatch options (``--flag=value``) for one homogeneous component."""
    args = [f"--partition={spec.partition}", f"--nodes={spec.node_count}",
            "--ntasks-per-node=1", f"--cpus-per-task={spec.cpus_per_node}"]
    if spec.gpus_per_node:
        kind = f"{spec.gpu_type}:" if spec.gpu_type else ""
        args.append(f"--gres=gpu:{kind}{spec.gpus_per_node}")
    return args


def _read(path: Path) -> _Template:
    try:
        tpl = _Template(path.read_text())
    except OSError as exc:
        raise ConfigError(f"template {str(path)!r} cannot be read ({exc.strerror})") from exc
    if not tpl.is_valid():
        raise ConfigError(f"template {str(path)!r}: an '@@' that starts no @@{{name}} "
                          "placeholder (write '@@@@' for a literal '@@')")
    return tpl


def check_allocation_template(path: Path) -> None:
    """ConfigError (one line naming ``path``) unless ``path`` is a readable template with
    exactly the allocation's placeholders: what a site's ``allocation_template`` must be."""
    wanted = set(_read(path).get_identifiers())
    missing, extra = ALLOCATION_PLACEHOLDERS - wanted, wanted - ALLOCATION_PLACEHOLDERS
    if missing or extra:
        each = ", ".join(f"@@{{{name}}}" for name in sorted(ALLOCATION_PLACEHOLDERS))
        raise ConfigError(f"allocation template {str(path)!r}: missing placeholders "
                          f"{sorted(missing)}, unknown placeholders {sorted(extra)}; it "
                          f"must use exactly {each}")


def render(path: Path, values: Mapping[str, str]) -> str:
    """Fill the template at ``path`` with ``values``; ConfigError on any mismatch."""
    tpl = _read(path)
    wanted = set(tpl.get_identifiers())
    missing, extra = wanted - set(values), set(values) - wanted
    if missing or extra:
        raise ConfigError(f"template {str(path)!r}: missing values {sorted(missing)}, "
                          f"unknown values {sorted(extra)}; placeholders are {sorted(wanted)}")
    return tpl.substitute(values)


def render_allocation(request: AllocationRequest, output: str = "/dev/null",
                      template: Path = ALLOCATION_TEMPLATE,
                      hold: Sequence[str] = HOLD_ARGV) -> str:
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
    return render(template, {
        "pool": request.pool, "group_id": request.group_id, "job_name": request.job_name,
        "comment": request.comment, "output": output, "time_directive": time_line,
        "component_directives": "\n".join(blocks), "hold_command": shlex.join(hold)})
