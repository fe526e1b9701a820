"""daemon/submission.py: #SBATCH and #WEAVE --account, --qos, --time, --output, --error and
--job-name (each spelling) reach the spec's [slurm] table, or are refused in one line;
weaved refuses at submission what no group can give."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.sbatch import JobSlurm
from weave_slurm.config.site import SlurmConfig, default_site
from weave_slurm.daemon.api import Api
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.submission import build_spec, read_directives, sbatch_flags
from weave_slurm.errors import ConfigError, InfeasibleRequest
from weave_slurm.placement import Capacity

REQUIRED = "#WEAVE --model-params-b=1 --rollout-gpus=8 --train-gpus=8 --max-tokens=64\n"


def _script(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/bash\n" + "".join(f"{line}\n" for line in lines) + REQUIRED
                    + "python train.py\n")
    return path


def test_sbatch_account_qos_time_output_error_reach_the_spec(tmp_path: Path) -> None:
    # Before: every #SBATCH line but -J was silently ignored (spec.slurm did not exist).
    path = _script(tmp_path, "#SBATCH -A physics", "#SBATCH --qos=high -t 1-02:03",
                   "#SBATCH --output /home/a/%x-%j.out -e/home/a/%j.err", "#SBATCH -J rl1")
    text, spec = build_spec(path, {})
    assert spec.slurm == JobSlurm("physics", "high", 1563, "/home/a/%x-%j.out", "/home/a/%j.err")
    assert spec.name == "rl1" and 'account = "physics"' in text


@pytest.mark.parametrize("tag", ["#SBATCH", "#WEAVE"])
@pytest.mark.parametrize(("line", "want"), [
    ("--account=phys", JobSlurm(account="phys")),
    ("--account phys", JobSlurm(account="phys")),
    ("-A phys", JobSlurm(account="phys")),
    ("-Aphys", JobSlurm(account="phys")),
    ("--qos=low", JobSlurm(qos="low")),
    ("--qos low", JobSlurm(qos="low")),
    ("-q low", JobSlurm(qos="low")),
    ("--time=30", JobSlurm(time_limit_min=30)),
    ("--time 2:30", JobSlurm(time_limit_min=3)),
    ("-t 1:00:00", JobSlurm(time_limit_min=60)),
    ("-t2-0", JobSlurm(time_limit_min=2880)),
    ("--time=UNLIMITED", JobSlurm()),
    ("--output=/l/o.%j", JobSlurm(output="/l/o.%j")),
    ("--output /l/o.%j", JobSlurm(output="/l/o.%j")),
    ("-o /l/o.%j", JobSlurm(output="/l/o.%j")),
    ("-o/l/o.%j", JobSlurm(output="/l/o.%j")),
    ("--error=/l/e.%j", JobSlurm(error="/l/e.%j")),
    ("--error /l/e.%j", JobSlurm(error="/l/e.%j")),
    ("-e /l/e.%j", JobSlurm(error="/l/e.%j")),
    ("-e/l/e.%j", JobSlurm(error="/l/e.%j")),
])
def test_each_spelling_in_either_tag(tmp_path: Path, tag: str, line: str,
                                     want: JobSlurm) -> None:
    assert build_spec(_script(tmp_path, f"{tag} {line}"), {})[1].slurm == want


@pytest.mark.parametrize("tag", ["#SBATCH", "#WEAVE"])
@pytest.mark.parametrize("line", ["--job-name=n1", "--job-name n1", "-J n1", "-Jn1"])
def test_job_name_in_each_spelling(tmp_path: Path, tag: str, line: str) -> None:
    assert build_spec(_script(tmp_path, f"{tag} {line}"), {})[1].name == "n1"


def test_flags_beat_directives_and_a_later_line_beats_an_earlier(tmp_path: Path) -> None:
    path = _script(tmp_path, "#SBATCH -A a1 -t 10", "#WEAVE --account=a2")
    assert build_spec(path, {})[1].slurm == JobSlurm(account="a2", time_limit_min=10)
    assert build_spec(path, {"account": "a3", "time": 5})[1].slurm.account == "a3"
    assert build_spec(path, {"time": 5})[1].slurm.time_limit_min == 5


def test_chdir_is_the_workers_working_directory(tmp_path: Path) -> None:
    assert build_spec(_script(tmp_path, "#SBATCH -D /home/alice/rl"), {})[1].workdir \
        == "/home/alice/rl"


@pytest.mark.parametrize(("line", "match"), [
    ("#SBATCH --partition=h20", r"train.sh:2: #SBATCH '--partition' is not honoured by weave "
     r".*; honoured: --account/-A, --qos/-q, --time/-t, --output/-o, --error/-e, "
     r"--job-name/-J, --chdir/-D, --dependency/-d, --hold/-H, --array/-a, --container$"),
    ("#SBATCH -N 2", r"train.sh:2: #SBATCH '-N' is not honoured"),
    ("#SBATCH --gpus=8", r"#SBATCH '--gpus' is not honoured"),
    ("#SBATCH -t 1h", r"train.sh:2: #SBATCH: --time='1h': not one of M, M:S, H:M:S, D-H, "
     r"D-H:M or D-H:M:S"),
    ("#WEAVE --time=soon", r"train.sh:2: #WEAVE: --time='soon': not one of"),
    ("#SBATCH -A 'a;b'", r"train.sh:2: #SBATCH: --account='a;b': must be a Slurm name"),
    ("#WEAVE --qos=a/b", r"#WEAVE: --qos='a/b': must be a Slurm name"),
    ("#SBATCH -o out.%Z", r"#SBATCH: --output='out.%Z': unknown replacement '%Z'"),
    ("#SBATCH --error", r"#SBATCH --error needs a value"),
])
def test_refusals_name_the_line_the_directive_and_why(tmp_path: Path, line: str,
                                                      match: str) -> None:
    path = _script(tmp_path, line)
    with pytest.raises(ConfigError, match=match) as info:
        read_directives(path.read_text(), str(path))
    assert "\n" not in str(info.value)


def test_late_sbatch_lines_are_not_directives_as_in_sbatch(tmp_path: Path) -> None:
    path = _script(tmp_path)
    path.write_text(path.read_text() + "#SBATCH --partition=h20\n")
    assert build_spec(path, {})[1].slurm == JobSlurm()


def _api(tmp_path: Path, slurm: SlurmConfig) -> Api:
    site = replace(default_site(), slurm=slurm)
    return Api(Store(tmp_path / "w.db"), site, Capacity.from_site(site), lambda: 0.0)


def test_weaved_refuses_a_time_over_the_sites_limit_and_more_gpus_than_a_pool(
        tmp_path: Path) -> None:
    api = _api(tmp_path, SlurmConfig(time_limit_min=60))
    spec = job_spec_toml("t")
    ok = api.submit(0, spec + "\n[slurm]\ntime_limit_min = 60\n", "t.toml", test_only=True)
    assert ok["valid"] is True
    with pytest.raises(InfeasibleRequest, match=r"t.toml: --time of 61 min exceeds this "
                       r"site's limit of 60 min"):
        api.submit(0, spec + "\n[slurm]\ntime_limit_min = 61\n", "t.toml", test_only=True)
    big = spec.replace("rollout = 1\n", "rollout = 8000\n")
    assert big != spec
    # already refused before this change (model/layout.py): more GPUs than a pool holds
    with pytest.raises(InfeasibleRequest, match=r"t.toml: key 'gpus.rollout' needs 1000 nodes "
                       r"but pool 'rollout' \(h20\) has max_nodes="):
        api.submit(0, big, "t.toml", test_only=True)
    assert api.store.jobs() == []


def test_weave_sbatch_flags_beat_directives_and_a_bad_one_is_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _script(tmp_path, "#SBATCH -A a1 -t 10 -o /l/x.out")
    flags = sbatch_flags(account="a2", qos=None, time="1:30:00", output=None, error="/l/e.%j")
    assert flags == {"account": "a2", "time": 90, "error": "/l/e.%j"}
    assert build_spec(path, flags)[1].slurm == JobSlurm("a2", None, 90, "/l/x.out", "/l/e.%j")
    for argv, said in ((["-t", "1h", str(path)], "--time='1h': not one of M, M:S"),
                       (["-A", "a;b", str(path)], "--account='a;b': must be a Slurm name"),
                       (["--socket", str(tmp_path / "none.sock"), str(_script(
                           tmp_path, "#SBATCH --mem=4G"))], "#SBATCH '--mem' is not honoured")):
        assert run_app(sbatch_app, "weave-sbatch", argv) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err



def test_solo_as_a_directive_a_spec_key_and_its_profile(tmp_path: Path) -> None:
    """``#WEAVE --solo`` (a switch, or =yes) sets the spec's ``solo``; the profile
    placement reads carries it (placement/constraints.py keeps the job alone)."""
    for line in ("#WEAVE --solo", "#WEAVE --solo=yes"):
        text, spec = build_spec(_script(tmp_path, line), {})
        assert spec.solo and "solo = true" in text
    assert not build_spec(_script(tmp_path), {})[1].solo
    with pytest.raises(ConfigError, match=r"--solo='maybe': takes no value"):
        build_spec(_script(tmp_path, "#WEAVE --solo=maybe"), {})
    toml = tmp_path / "job.toml"
    toml.write_text(job_spec_toml("s", iterations=2, seed=1))
    text, spec = build_spec(toml, {"solo": True})   # weave-sbatch --solo on a spec file
    assert spec.solo
    api = _api(tmp_path, SlurmConfig())
    job = api.submit(0, text, "job.toml")["job"]
    row = api.store.job(job)
    assert row is not None and row.profile.solo
    assert api.status({"jobs": [job]})["jobs"][0]["solo"] is True
