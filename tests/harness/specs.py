"""The job specs the runtime tests submit: the small reference job
(:func:`weave_slurm.config.render.job_spec_toml`) made fast to run."""

from __future__ import annotations

from weave_slurm.config.render import job_spec_toml

#: Small and fast: the default toy model, 4 prompts x 4 samples.
OPTIONS = {"prompts_per_step": 4, "group_size": 4}


def job_spec(name: str, seed: int, iterations: int) -> str:
    """The reference GRPO toy with :data:`OPTIONS`, ``iterations`` steps from ``seed``."""
    return job_spec_toml(name, iterations=iterations, seed=seed, options=OPTIONS)
