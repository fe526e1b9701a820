"""job_spec_toml round-trips through parse_job: a rendered spec always parses, to the
values it was rendered from."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.config.job import options_dict, parse_job
from weave_slurm.config.profile_table import Durations
from weave_slurm.config.render import job_spec_toml, toml_tables
from weave_slurm.errors import ConfigError

names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
users = st.from_regex(r"\A[a-z_][a-z0-9_-]{0,31}\Z")
finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.one_of(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), finite,
                    st.booleans())
seconds = st.none() | st.floats(0.001, 1e6)
gib = st.none() | st.floats(0.001, 1e3)
option_keys = st.text(max_size=12)
option_leaves = scalars | st.lists(scalars, max_size=4)


def _option_tables(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    """Non-empty tables nested at most ``depth + 1`` deep."""
    values = option_leaves if depth == 0 else option_leaves | _option_tables(depth - 1)
    return st.dictionaries(option_keys, values, min_size=1, max_size=3)


#: [options] as a caller gives them: scalars, lists and tables up to 4 deep
options_strategy = st.dictionaries(option_keys, option_leaves | _option_tables(3), max_size=5)


def _frozen(options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """What the parser makes of ``options``: sorted pairs, lists and tables as tuples."""
    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return _frozen(v)
        return tuple(v) if isinstance(v, list) else v
    return tuple((k, value(v)) for k, v in sorted(options.items()))


def _typed(value: Any) -> Any:
    """``value`` with every scalar tagged by its type (``1``, ``1.0`` and ``True`` differ)."""
    if isinstance(value, tuple):
        return tuple(_typed(v) for v in value)
    return (type(value).__name__, value)


def test_the_small_reference_job_parses_to_its_values() -> None:
    job = parse_job(job_spec_toml("ref"))
    assert (job.name, job.slo, job.entry, job.iterations, job.seed) == \
        ("ref", 3.0, "builtin:grpo-toy", 10, 0)   # iterations, seed: parser defaults
    assert job.model.params_b == 0.5 and (job.rollout_gpus, job.train_gpus) == (1, 1)
    assert (job.rollout.prompts_per_step, job.rollout.samples_per_prompt,
            job.rollout.max_response_tokens) == (8, 2, 256)
    assert job.profile.rollout == job.profile.train == Durations(10.0, 10.0)
    assert job.profile.rollout_state_gib == job.profile.train_state_gib == 1.0
    assert job.options == ()


@settings(max_examples=200, deadline=None)
@given(name=names, slo=st.none() | st.floats(1.0, 1e3),
       iterations=st.none() | st.integers(1, 10**6),
       seed=st.none() | st.integers(0, 2**31), staleness=st.none() | st.integers(0, 8),
       user=st.none() | users, params_b=st.floats(0.01, 1e4),
       sizes=st.tuples(st.integers(1, 4096), st.integers(1, 64), st.integers(1, 1 << 16)),
       gpus=st.tuples(st.integers(1, 64), st.integers(1, 64)),
       profile=st.tuples(seconds, seconds, gib, gib),
       options=options_strategy)
def test_any_rendered_spec_parses_to_what_was_rendered(
        name: str, slo: float | None, iterations: int | None, seed: int | None,
        staleness: int | None, user: str | None, params_b: float,
        sizes: tuple[int, int, int], gpus: tuple[int, int],
        profile: tuple[float | None, float | None, float | None, float | None],
        options: dict[str, Any]) -> None:
    rollout_s, train_s, rollout_gib, train_gib = profile
    text = job_spec_toml(name, slo=slo, iterations=iterations, seed=seed, staleness=staleness,
                         user=user, params_b=params_b, prompts_per_step=sizes[0],
                         samples_per_prompt=sizes[1], max_response_tokens=sizes[2],
                         rollout_gpus=gpus[0], train_gpus=gpus[1], rollout_s=rollout_s,
                         train_s=train_s, rollout_state_gib=rollout_gib,
                         train_state_gib=train_gib, options=options)
    job = parse_job(text)
    assert (job.name, job.slo, job.iterations, job.seed, job.staleness) == (
        name, slo, 10 if iterations is None else iterations, 0 if seed is None else seed,
        0 if staleness is None else staleness)
    assert user is None or job.user == user
    assert job.model.params_b == params_b
    assert (job.rollout.prompts_per_step, job.rollout.samples_per_prompt,
            job.rollout.max_response_tokens) == sizes
    assert (job.rollout_gpus, job.train_gpus) == gpus
    assert job.profile.rollout == (None if rollout_s is None else Durations(rollout_s, rollout_s))
    assert job.profile.train == (None if train_s is None else Durations(train_s, train_s))
    assert (job.profile.rollout_state_gib, job.profile.train_state_gib) == (rollout_gib,
                                                                            train_gib)
    assert _typed(job.options) == _typed(_frozen(options))
    assert options_dict(job.options) == options


def test_keys_left_out_take_the_parsers_defaults() -> None:
    text = job_spec_toml("bare", slo=None, rollout_s=None, train_s=None,
                         rollout_state_gib=None, train_state_gib=None)
    assert "slo" not in text and "[profile]" not in text and "[options]" not in text
    job = parse_job(text)
    assert job.slo is None and job.profile.rollout is None and job.profile.train is None


def test_a_value_that_is_not_a_scalar_is_refused_naming_its_key() -> None:
    with pytest.raises(ConfigError, match=r"key 'options.bad' = \[\[1, 2\]\]: cannot write a list"):
        toml_tables({"options": {"bad": [[1, 2]]}})  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"key 'options.engine.x' = \{\}: cannot write an "
                                          r"empty table"):
        toml_tables({"options": {"engine": {"x": {}}}})


def test_nested_options_are_written_as_tables_after_their_parents_keys() -> None:
    text = job_spec_toml("nest", options={"engine": {"tensor_parallel_size": 2,
                                                     "extra": {"enforce_eager": True}},
                                          "layers": [1, 2.5, "x", False], "task": "copy"})
    assert text.endswith('[options]\nlayers = [1, 2.5, "x", false]\ntask = "copy"\n'
                         "[options.engine]\ntensor_parallel_size = 2\n"
                         "[options.engine.extra]\nenforce_eager = true\n")
    assert parse_job(text).options == (
        ("engine", (("extra", (("enforce_eager", True),)), ("tensor_parallel_size", 2))),
        ("layers", (1, 2.5, "x", False)), ("task", "copy"))
    quoted = job_spec_toml("q", options={"a b": {"c.d": 1}})
    assert '[options."a b"]\n"c.d" = 1\n' in quoted
    assert parse_job(quoted).options == (("a b", (("c.d", 1),)),)


@settings(max_examples=100, deadline=None)
@given(workdir=st.none() | st.text(min_size=1, max_size=30).filter(str.strip),
       python=st.none() | st.text(min_size=1, max_size=30).filter(str.strip),
       pythonpath=st.none() | st.lists(st.text(min_size=1, max_size=20).filter(str.strip),
                                       max_size=4))
def test_the_code_keys_round_trip(workdir: str | None, python: str | None,
                                  pythonpath: list[str] | None) -> None:
    job = parse_job(job_spec_toml("code", workdir=workdir, python=python,
                                  pythonpath=pythonpath))
    assert (job.workdir, job.python, job.pythonpath) == (workdir, python,
                                                         tuple(pythonpath or ()))


def test_the_code_keys_are_top_level_keys() -> None:
    text = job_spec_toml("code", workdir="/home/a/proj", python="/home/a/venv/bin/python",
                         pythonpath=["/home/a/proj/src", "/home/a/x y"])
    head = text.split("[model]")[0]
    assert 'workdir = "/home/a/proj"\n' in head and 'python = "/home/a/venv/bin/python"\n' \
        in head and 'pythonpath = ["/home/a/proj/src", "/home/a/x y"]\n' in head
    assert "workdir" not in job_spec_toml("plain")


def test_a_key_that_ends_in_a_newline_is_quoted_not_written_bare() -> None:
    """A bare-key check anchored with ``$`` let "0\\n" through (``$`` matches before a
    final newline), and the key was written bare, as "0": two keys became one."""
    text = job_spec_toml("x", options={"0": "", "0\n": {"k": "v"}})
    assert options_dict(parse_job(text).options) == {"0": "", "0\n": {"k": "v"}}


@pytest.mark.parametrize("name", ["job\n", "job\n#SBATCH --uid=0"])
def test_a_job_name_with_a_newline_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="name"):
        parse_job(job_spec_toml(name))
