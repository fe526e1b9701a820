"""The job specs the runtime tests submit: the small reference job
(:func:`weave_slurm.config.render.job_spec_toml`) made fast to run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weave_slurm.config.job import JobSpec, parse_job
from weave_slurm.config.render import job_spec_toml

#: Small and fast: the default toy model, 4 prompts x 4 samples.
OPTIONS = {"prompts_per_step": 4, "group_size": 4}


def job_spec(name: str, seed: int, iterations: int) -> str:
    """The reference GRPO toy with :data:`OPTIONS`, ``iterations`` steps from ``seed``."""
    return job_spec_toml(name, iterations=iterations, seed=seed, options=OPTIONS)


def with_output(text: str, parent: Path) -> str:
    """``text`` writing its output in a directory under ``parent`` that every uid may
    write to (a job of a user with no home, ``nobody``: without one its default
    ``weave-%j.out`` in that home is refused at submission)."""
    out = parent / "outputs"
    out.mkdir(exist_ok=True)
    out.chmod(0o1777)
    return f'{text}\n[slurm]\noutput = "{out}/weave-%j.out"\n'


def stored(name: str, text: str | None = None) -> dict[str, Any]:
    """``Store.add_job``'s ``spec`` and ``spec_toml``: ``text`` (default: the reference
    job named ``name``) as submitted and as parsed at submission."""
    text = job_spec_toml(name) if text is None else text
    return {"spec": parse_job(text, f"{name}.toml"), "spec_toml": text}


def typed(text: str) -> tuple[JobSpec, str]:
    """A :class:`~weave_slurm.daemon.records.JobRow`'s ``spec`` and ``spec_toml``."""
    return parse_job(text), text
