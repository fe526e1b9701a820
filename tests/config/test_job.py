from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave_slurm.config.job import (
    Algorithm,
    JobSpec,
    check_paths,
    code_paths,
    load_job,
    options_dict,
    parse_job,
    spec_paths,
)
from weave_slurm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "configs" / "jobs").glob("*.toml"))

BASE = """
name = "j1"
user = "alice"
slo = 1.5
[model]
params_b = 7
[rollout]
prompts_per_step = 8
samples_per_prompt = 4
max_response_tokens = 4096
[gpus]
rollout = 8
train = 8
"""


def test_examples_span_3b_to_32b_and_4k_to_32k() -> None:
    specs = [load_job(p) for p in JOBS]
    sizes = [s.model.params_b for s in specs]
    tokens = [s.rollout.max_response_tokens for s in specs]
    assert min(sizes) <= 3.5 and max(sizes) >= 32
    assert min(tokens) == 4096 and max(tokens) == 32768
    assert len({s.name for s in specs}) == len(specs)


def test_profile_shorthand_and_table() -> None:
    spec = parse_job(BASE + "[profile]\ntrain_s = 100\nrollout_s = {samples = [10, 30, 20]}\n")
    assert spec.profile.train is not None and spec.profile.train.max_s == 100
    assert spec.profile.rollout is not None
    assert spec.profile.rollout.mean_s == 20 and spec.profile.rollout.max_s == 30
    assert spec.algorithm is Algorithm.GRPO


@pytest.mark.parametrize(("edit", "needle"), [
    (("slo = 1.5", "slo = 0.9"), "'slo' = 0.9: must be >= 1"),
    (("params_b = 7", "params_b = -7"), "'model.params_b' = -7.0: must be > 0"),
    (("train = 8", "train = 0"), "'gpus.train' = 0: must be > 0"),
    (("rollout = 8", "rollout = 8.5"), "'gpus.rollout' = 8.5: must be an integer"),
    (("user = \"alice\"", "user = \"alice\"\nalgorithm = \"sac\""), "valid choices: dapo, grpo"),
    (("name = \"j1\"", "name = \"bad name!\""), "'name' = 'bad name!'"),
    (("[gpus]", "[gpus]\nrolout = 2"), "unknown key 'gpus.rolout'"),
    (("name = \"j1\"", ""), "missing required key 'name'"),
    (("max_response_tokens = 4096", "max_response_tokens = 1000000000"),
     "'rollout.max_response_tokens' = 1000000000: must be <= 1048576"),
    (("max_response_tokens = 4096", "max_response_tokens = 1e9"),
     "'rollout.max_response_tokens' = 1000000000.0: must be an integer"),
    (("prompts_per_step = 8", "prompts_per_step = 100000000"), "must be <= 65536"),
])
def test_bad_spec_is_one_clear_line(edit: tuple[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_job(BASE.replace(*edit), "job.toml")
    assert needle in str(err.value)
    assert str(err.value).startswith("job.toml")


def test_profile_max_below_mean_refused() -> None:
    with pytest.raises(ConfigError, match=r"'profile.rollout_s.max' = 5.0: must be >= mean"):
        parse_job(BASE + "[profile]\nrollout_s = {mean = 10, max = 5}\n", "job.toml")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes(text: str) -> None:
    try:
        parse_job(text, "fuzz.toml")
    except ConfigError as exc:
        assert "\n" not in str(exc).strip() or "invalid TOML" in str(exc)


scalars = st.one_of(st.integers(-10, 10**6), st.floats(), st.text(max_size=5),
                    st.booleans(), st.lists(st.integers(), max_size=3))


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return json.dumps(v)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(["slo", "model.params_b", "rollout.max_response_tokens",
                            "gpus.train", "rollout.prompt_tokens"]),
       value=scalars)
def test_any_value_in_any_key_is_valid_or_a_config_error(key: str, value: object) -> None:
    table, _, leaf = key.rpartition(".")
    lines = [ln for ln in BASE.splitlines() if not ln.startswith(f"{leaf} =")]
    at = lines.index(f"[{table}]") + 1 if table else 1
    lines.insert(at, f"{leaf} = {_toml_value(value)}")
    try:
        parse_job("\n".join(lines), "fuzz.toml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.toml")


# -- the user's own code: workdir, python, pythonpath ------------------------------------

CODE = 'workdir = "/home/alice/proj"\npython = "/home/alice/venv/bin/python"\n' \
       'pythonpath = ["/home/alice/proj/src", "/home/alice/lib"]\n'


def test_code_keys_parse_and_default_to_none() -> None:
    spec = parse_job(CODE + BASE)
    assert (spec.workdir, spec.python, spec.pythonpath) == (
        "/home/alice/proj", "/home/alice/venv/bin/python",
        ("/home/alice/proj/src", "/home/alice/lib"))
    bare = parse_job(BASE)
    assert (bare.workdir, bare.python, bare.pythonpath) == (None, None, ())


@pytest.mark.parametrize(("line", "needle"), [
    ('pythonpath = "/a/src"', "key 'pythonpath' = '/a/src': must be a list"),
    ("pythonpath = [1]", "key 'pythonpath' = [1]: must be a list of paths"),
    ('pythonpath = ["/a", ""]', "key 'pythonpath' = ['/a', '']: must be a list of paths"),
    ("python = 3", "key 'python' = 3: must be a string"),
    ('workdir = "  "', "key 'workdir' = '  ': must not be empty"),
    ('pythonpath = [' + ", ".join(['"/a"'] * 17) + "]", "at most 16 entries"),
    ('pythonpat = ["/a"]', "unknown key 'pythonpat'; valid keys here: "),
])
def test_bad_code_keys_are_one_line_naming_key_and_value(line: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_job(line + "\n" + BASE, "job.toml")
    message = str(err.value)
    assert needle in message and message.startswith("job.toml") and "\n" not in message
    if "unknown key" in needle:
        assert "pythonpath" in message and "workdir" in message   # the valid keys


def test_code_paths_must_stay_in_the_users_dirs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "src").mkdir()
    # a venv's python is a symlink to the base interpreter, outside every allowed dir
    (home / "venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    (home / "out").symlink_to("/etc")
    uid = os.getuid()

    def spec(workdir: str, python: str, *path: str) -> JobSpec:
        entries = ", ".join(json.dumps(p) for p in path)
        return parse_job(f'workdir = "{workdir}"\npython = "{python}"\n'
                         f"pythonpath = [{entries}]\n" + BASE, "job.toml")

    venv_python = str(home / "venv" / "bin" / "python")
    check_paths(spec(str(home), venv_python, str(home / "src")), uid, roots=[home])
    refused = [
        (spec("/etc", venv_python), "key 'workdir' = '/etc'", "outside your own"),
        (spec(str(home), "/usr/bin/python3"), "key 'python' = '/usr/bin/python3'",
         "outside your own"),
        (spec(str(home), venv_python, str(home / "src"), str(home / "out")),
         "key 'pythonpath[1]' = ", "resolves to '/etc'"),
        (spec("proj", venv_python), "key 'workdir' = 'proj'", "must be an absolute path"),
        (spec(str(home), venv_python, f"{home}/src/../../x"), "key 'pythonpath[0]'",
         "'..' is not allowed"),
    ]
    for job, key, why in refused:
        with pytest.raises(ConfigError) as err:
            check_paths(job, uid, roots=[home])
        assert key in str(err.value) and why in str(err.value), err.value
        assert str(home) in str(err.value) and "\n" not in str(err.value)
    assert [k for k, _ in code_paths(spec(str(home), venv_python, "/a", "/b"))] == \
        ["workdir", "python", "pythonpath[0]", "pythonpath[1]"]


# -- [options]: scalars, lists of scalars, nested tables --------------------------------

NESTED = """
[options]
task = "copy"
layers = [1, 2]
[options.engine]
tensor_parallel_size = 2
devices = ["cuda:0", "cuda:1"]
[options.engine.extra]
enforce_eager = true
"""


def test_nested_options_freeze_to_sorted_tuples_and_thaw_to_dicts() -> None:
    spec = parse_job(BASE + NESTED)
    assert spec.options == (
        ("engine", (("devices", ("cuda:0", "cuda:1")), ("extra", (("enforce_eager", True),)),
                    ("tensor_parallel_size", 2))),
        ("layers", (1, 2)), ("task", "copy"))
    hash(spec)  # the frozen spec stays hashable
    seen = {"engine": {"devices": ["cuda:0", "cuda:1"], "extra": {"enforce_eager": True},
                       "tensor_parallel_size": 2}, "layers": [1, 2], "task": "copy"}
    assert options_dict(spec.options) == seen
    # the runtime's path: dict(spec.options), then a JSON trip to the worker
    assert options_dict(json.loads(json.dumps(dict(spec.options)))) == seen
    assert options_dict(seen) == seen


@pytest.mark.parametrize(("text", "needle"), [
    ("[options]\nbad = [[1, 2]]\n", "key 'options.bad' = [[1, 2]]: a list must hold"),
    ("[options.engine]\nx = [{a = 1}]\n", "key 'options.engine.x' = [{'a': 1}]: a list"),
    ("[[options.runs]]\nseed = 1\n", "key 'options.runs' = [{'seed': 1}]: a list"),
    ("[options.engine]\n", "key 'options.engine' = {}: an empty table; leave it out"),
    ("[options.engine]\nwhen = 1979-05-27\n", "key 'options.engine.when' = "
     "datetime.date(1979, 5, 27): must be a string, number, boolean"),
    ("[options]\na = {b = {c = {d = {e = {f = 1}}}}}\n", "key 'options.a.b.c.d.e' = {'f': 1}: "
     "tables nest at most 4 deep"),
    ("options = 3\n", "key 'options' must be a table"),
])
def test_bad_nested_options_are_one_line_naming_the_key(text: str, needle: str) -> None:
    top, tables = (text, "") if text.startswith("options") else ("", text)
    with pytest.raises(ConfigError) as err:
        parse_job(top + BASE + tables, "job.toml")
    message = str(err.value)
    assert needle in message and message.startswith("job.toml") and "\n" not in message


def test_paths_in_nested_options_are_checked(tmp_path: Path) -> None:
    spec = parse_job(BASE + '[options]\nout_dir = "/etc"\nfiles = ["/srv/a"]\n'
                     '[options.engine]\nmodel_dir = "/etc"\nname = "Qwen/Qwen2.5-7B"\n',
                     "job.toml")
    assert spec_paths(spec) == [("options.engine.model_dir", "/etc"),
                                ("options.files[0]", "/srv/a"), ("options.out_dir", "/etc")]
    with pytest.raises(ConfigError, match=r"key 'options.engine.model_dir' = '/etc'.*outside"):
        check_paths(spec, os.getuid(), roots=[tmp_path])
