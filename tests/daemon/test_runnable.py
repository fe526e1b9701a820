"""daemon/runnable.py: a job runs as declared or is refused at submission in one line
(issue 30): no entry, an unknown built-in, another algorithm, options its layout
cannot run, fewer ranks than declared, an entry its own interpreter cannot import."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.site import default_site
from weave_slurm.daemon.runnable import check_runnable
from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import member_layout

SITE = default_site()


def _check(text: str, site=SITE, python: str | None = sys.executable) -> None:  # type: ignore[no-untyped-def]
    job = parse_job(text, "j.toml")
    check_runnable(job, member_layout(job, site), site, os.geteuid(), python)


def _refused(text: str, **kw: object) -> str:
    with pytest.raises(ConfigError) as err:
        _check(text, **kw)  # type: ignore[arg-type]
    words = str(err.value)
    assert "\n" not in words and words.startswith("j.toml: "), words
    return words


def test_a_spec_without_entry_is_planning_only() -> None:
    words = _refused(job_spec_toml("p", entry=None))
    assert "no 'entry': a planning-only spec (weave plan, weave simulate)" in words


def test_an_unknown_builtin_names_the_valid_ones() -> None:
    words = _refused(job_spec_toml("p", entry="builtin:grpo-nope"))
    assert "'builtin:grpo-nope': no such built-in job; valid: builtin:grpo-toy," in words


def test_a_builtin_runs_only_the_algorithm_it_implements() -> None:
    words = _refused('algorithm = "ppo"\n' + job_spec_toml("p"))
    assert "key 'algorithm' = 'ppo': builtin:grpo-toy implements grpo" in words


def test_engines_need_per_prompt_sampling_and_a_gang_rows() -> None:
    eight = job_spec_toml("p", rollout_gpus=8, train_gpus=8)
    assert "options.sampling = 'batch': a rollout over 8 engines" in _refused(eight)
    _check(job_spec_toml("p", rollout_gpus=8, train_gpus=8,
                         options={"sampling": "per_prompt"}))
    few = job_spec_toml("p", train_gpus=8, options={"prompts_per_step": 2, "group_size": 2,
                                                    "minibatches": 2})
    assert "options.minibatches = 2: a minibatch of 2 rows" in _refused(few)


def test_a_site_without_gangs_refuses_a_layout_it_would_run_smaller() -> None:
    site = replace(SITE, runtime=replace(SITE.runtime, gangs=False))
    words = _refused(job_spec_toml("p", train_gpus=2), site=site)
    assert "layout is train 1x2 ranks; rollout 1x1 engine x 1 GPU" in words
    assert "[runtime] gangs = false" in words
    _check(job_spec_toml("p"), site=site)      # 1 + 1 runs as declared there


def test_a_trl_job_runs_one_rank() -> None:
    words = _refused(job_spec_toml("p", entry="builtin:trl-grpo-tiny", train_gpus=2))
    assert "runs each role as one process" in words


def test_an_own_entry_is_imported_in_its_interpreter(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("def make():\n    return None\n")
    own = job_spec_toml("p", entry="mypkg.job:make", pythonpath=[str(tmp_path / "src")])
    _check(own)
    words = _refused(job_spec_toml("p", entry="mypkg.job:make"))
    assert "'mypkg.job:make' cannot be imported by the job's workers" in words
    assert "ModuleNotFoundError: No module named 'mypkg'" in words
    words = _refused(own.replace("mypkg.job:make", "mypkg.job:nope"))
    assert "AttributeError" in words and "nope" in words


def test_an_engines_own_options_are_checked_by_its_parser() -> None:
    words = _refused(job_spec_toml("p", entry="builtin:grpo-toy-deepspeed",
                                   options={"engine": {"zero_stage": 3}}))
    assert "options.engine.zero_stage: unsupported value 3 (valid: 1, 2)" in words
    _check(job_spec_toml("p", entry="builtin:grpo-toy-deepspeed",
                         options={"engine": {"zero_stage": 2}}), python=None)
    words = _refused(job_spec_toml("p", entry="builtin:grpo-toy-vllm",
                                   options={"engine": {"bogus": 1}}))
    assert "options.engine: unknown key 'bogus'" in words
