"""Entry points: how a job spec names its RL job.

``builtin:<name>`` selects a built-in job (:data:`BUILTINS`); ``package.module:factory``
names a zero-argument callable (usually the job class) that returns an object
implementing :class:`~weave_slurm.workloads.api.RLJob`. Nothing is imported until
:func:`load_job` is called.
"""

from __future__ import annotations

import importlib
import re
import sys

from weave_slurm.errors import ConfigError
from weave_slurm.workloads.api import JobContext, JobRunner, RLJob
from weave_slurm.workloads.builtins import targets

#: Built-in jobs: name -> "module:factory" (imported lazily; workloads/builtins.py).
BUILTINS: dict[str, str] = dict(targets())

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*\Z")


def resolve(entry_point: str) -> str:
    """Map an entry point to ``module:attr``; ``ConfigError`` on a malformed one."""
    if entry_point.startswith("builtin:"):
        name = entry_point[len("builtin:"):]
        if name not in BUILTINS:
            raise ConfigError(f"entry_point: unknown built-in {entry_point!r} "
                              f"(valid: {', '.join('builtin:' + b for b in BUILTINS)})")
        return BUILTINS[name]
    module, sep, attr = entry_point.partition(":")
    if not sep or not _DOTTED.match(module) or not _DOTTED.match(attr):
        raise ConfigError(f"entry_point: {entry_point!r} is neither 'builtin:<name>' nor "
                          f"'package.module:factory'")
    return entry_point


def load_job(entry_point: str) -> RLJob:
    """Import and instantiate the job an entry point names (not yet set up)."""
    module_name, _, attr = resolve(entry_point).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"entry_point: {entry_point!r}: cannot import module "
                          f"{module_name!r}: {exc}{_hint(module_name, exc)}") from None
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"entry_point: {entry_point!r}: module {module_name!r} has "
                              f"no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"entry_point: {entry_point!r}: {attr!r} is not callable")
    job = target()
    if not isinstance(job, RLJob):
        raise ConfigError(f"entry_point: {entry_point!r}: {attr!r} returned "
                          f"{type(job).__name__}, which lacks the RLJob methods (setup, "
                          f"generate, update, export_weights, import_weights, "
                          f"state_tensors, load_state)")
    return job


def _hint(module_name: str, exc: ImportError) -> str:
    """What to do when the job's own package (not one of its imports) is not found."""
    if exc.name != module_name.partition(".")[0]:
        return ""
    return (f" (not on the worker's sys.path, which starts {sys.path[:3]}: name the "
            "directory holding it in the spec's 'pythonpath'; docs/job_api.md, 'Your own "
            "code')")


def start_job(entry_point: str, ctx: JobContext, *, staleness: int = 0) -> JobRunner:
    """Load the job, set it up for ``ctx`` and wrap it in a :class:`JobRunner`."""
    return JobRunner(load_job(entry_point), ctx, staleness=staleness)
