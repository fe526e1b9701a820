"""weave-sbatch: spec files and #WEAVE scripts, flags, refusals, and submission."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.conftest import Running, public_dir, weaved  # noqa: F401
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.sbatch import app
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.submission import build_spec, read_directives, to_toml
from weave_slurm.errors import ConfigError

SCRIPT = """\
#!/bin/bash
#SBATCH -J my-rl
#WEAVE --entry=builtin:grpo-toy --engine-gpus=8
#WEAVE --slo=2.5 --rollout-gpus=8
#WEAVE --train-gpus 8 --max-tokens=256
#WEAVE --model-params-b=0.5 --rollout-s=10 --train-s=10
#WEAVE --rollout-state-gib=1 --train-state-gib=1
echo hello
#WEAVE --slo=9  (after the header: ignored, as sbatch ignores late #SBATCH)
"""


def test_script_directives_build_a_spec(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    text, spec = build_spec(script, {})
    assert spec.name == "my-rl" and spec.slo == 2.5 and spec.rollout_gpus == 8
    assert spec.rollout.max_response_tokens == 256 and spec.profile.train is not None
    _, flagged = build_spec(script, {"slo": 1.5, "job-name": "other"})
    assert flagged.slo == 1.5 and flagged.name == "other"  # flags beat directives
    assert "max_response_tokens = 256" in text


def test_spec_file_with_overrides_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(job_spec_toml("tiny"))
    text, spec = build_spec(path, {"max-tokens": 128})
    assert spec.rollout.max_response_tokens == 128 and spec.profile.rollout is not None
    assert build_spec(path, {})[1] == build_spec(path, {})[1]
    assert "[profile]" in to_toml({"profile": {"rollout_s": {"mean": 1.0, "max": 2.0}}}) \
        or "profile" in text


@pytest.mark.parametrize(("line", "match"), [
    ("#WEAVE --slo=fast", r"train.sh:2: #WEAVE: --slo='fast' is not a number"),
    ("#WEAVE --gpus=8", r"unknown option '--gpus'; valid: --job-name"),
    ("#WEAVE --slo", r"needs a value"),
    ("#WEAVE slo=2", r"expected an option like --slo=1.5"),
    ("#WEAVE --slo='1.5", r"cannot parse #WEAVE line"),
])
def test_malformed_directives_are_refused_with_the_line(tmp_path: Path, line: str,
                                                        match: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{line}\n")
    with pytest.raises(ConfigError, match=match):
        read_directives(script.read_text(), str(script))


def test_missing_and_invalid_values_are_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#WEAVE --slo=2\n")
    with pytest.raises(ConfigError, match=r"missing #WEAVE --model-params-b"):
        build_spec(script, {})
    with pytest.raises(ConfigError, match="slo"):
        build_spec(script, {"model-params-b": 1.0, "rollout-gpus": 8, "train-gpus": 8,
                            "max-tokens": 64, "slo": 0.2})
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [\n")
    with pytest.raises(ConfigError, match=r"bad.toml: invalid TOML"):
        build_spec(bad, {})


def test_submit_prints_like_sbatch_and_refuses_cleanly(
        weaved: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("tiny"))
    sock = ["--socket", str(weaved.socket)]
    assert run_app(app, "weave-sbatch", [str(spec), *sock]) == 0
    assert capsys.readouterr().out.strip() == "Submitted weave job 1"
    assert run_app(app, "weave-sbatch", [str(spec), "--parsable", *sock]) == 0
    assert capsys.readouterr().out.strip() == "2"
    assert run_app(app, "weave-sbatch", [str(spec), "--slo", "0.3", *sock]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("weave-sbatch: error:") and "slo" in err and len(err.splitlines()) == 1
    assert run_app(app, "weave-sbatch", [str(spec), "--rollout-gpus", "800", *sock]) == 2
    assert "needs 100 nodes" in capsys.readouterr().err
    monkeypatch.setenv("WEAVE_DAEMON_WAIT_S", "0")   # no wait for a weaved starting there
    assert run_app(app, "weave-sbatch", [str(spec), "--socket", "/nonexistent/s"]) == 1
    assert "no weaved at" in capsys.readouterr().err


# -- the user's own code: --workdir, --python, --pythonpath ------------------------------

CODE_SCRIPT = """\
#!/bin/bash
#WEAVE --model-params-b=0.5 --rollout-gpus=8 --train-gpus=8 --max-tokens=64
#WEAVE --workdir={work} --python={python}
#WEAVE --pythonpath={src}:{lib}
#WEAVE --pythonpath {extra}
python -m my_pkg.train
"""


def _code(tmp_path: Path) -> dict[str, str]:
    for d in ("work", "src", "lib", "extra", "venv/bin"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return {k: str(tmp_path / k) for k in ("work", "src", "lib", "extra")} | \
        {"python": str(python)}


def test_code_directives_and_flags(tmp_path: Path) -> None:
    paths = _code(tmp_path)
    script = tmp_path / "train.sh"
    script.write_text(CODE_SCRIPT.format(**paths))
    text, spec = build_spec(script, {})
    assert (spec.workdir, spec.python) == (paths["work"], paths["python"])
    assert spec.pythonpath == (paths["src"], paths["lib"], paths["extra"])   # they add up
    assert f'pythonpath = ["{paths["src"]}", ' in text
    _, flagged = build_spec(script, {"pythonpath": ["/z"], "workdir": "/w"})
    assert flagged.pythonpath == ("/z",) and flagged.workdir == "/w"     # flags win
    with pytest.raises(ConfigError, match=r"train.sh:2: #WEAVE: --pythonpath=':' names no "
                       r"path"):
        read_directives("#!/bin/bash\n#WEAVE --pythonpath=:\n", str(script))


def test_test_only_refuses_code_paths_that_are_not_there_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEAVE_DAEMON_WAIT_S", "0")   # no wait for a weaved starting there
    paths = _code(tmp_path)
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("code"))
    base = [str(spec), "--test-only"]
    ok = ["--workdir", paths["work"], "--python", paths["python"],
          "--pythonpath", f"{paths['src']}:{paths['lib']}", "--pythonpath", paths["extra"]]
    # the paths pass here, as this user; then --test-only asks weaved (none at this socket)
    nowhere = ["--socket", str(tmp_path / "no-weaved.sock")]
    assert run_app(app, "weave-sbatch", [*base, *ok, *nowhere]) == 1
    assert "no weaved at" in capsys.readouterr().err
    refused = [
        (["--python", "/nowhere/bin/python"], "key 'python' = '/nowhere/bin/python': does "
         "not exist"),
        (["--python", paths["work"]], f"key 'python' = '{paths['work']}': is not a file"),
        (["--workdir", paths["python"]], f"key 'workdir' = '{paths['python']}': is not a "
         "directory"),
        (["--pythonpath", f"{paths['src']}:/nowhere/src"],
         "key 'pythonpath[1]' = '/nowhere/src': does not exist"),
    ]
    for flags, needle in refused:
        assert run_app(app, "weave-sbatch", [*base, *flags]) == 2, flags
        err = capsys.readouterr().err.strip()
        assert err.startswith("weave-sbatch: error:") and needle in err, err
        assert len(err.splitlines()) == 1


def test_weaved_refuses_code_paths_outside_the_users_dirs(
        weaved: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    paths = _code(tmp_path)     # under /tmp: neither root's home nor a site root
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("code"))
    argv = [str(spec), "--workdir", paths["work"], "--socket", str(weaved.socket)]
    assert run_app(app, "weave-sbatch", argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"key 'workdir' = '{paths['work']}'" in err and "outside your own" in err, err
    assert len(err.splitlines()) == 1


def test_test_only_checks_the_job_against_weaveds_site_and_stores_nothing(
        weaved: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    from tests.harness.weaved import call
    from weave_slurm.daemon.protocol import Op

    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("fits"))
    sock = ["--socket", str(weaved.socket)]
    assert run_app(app, "weave-sbatch", [str(spec), "--test-only", *sock]) == 0
    out = capsys.readouterr().out
    assert "job 'fits' would fit this site: 1 rollout and 1 training node(s)" in out, out
    assert "(not submitted)" in out
    assert run_app(app, "weave-sbatch", [str(spec), "--test-only", "--rollout-gpus",
                                         str(10**20), *sock]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs" in err and "max_nodes" in err and len(err.splitlines()) == 1, err
    assert call(weaved.socket, Op.STATUS)["jobs"] == []            # nothing was stored



def test_engine_gpus_directive_and_flag_reach_the_layout(
        weaved: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    script = tmp_path / "train.sh"
    # cooperative: its own processes, so a layout of several engines is its own business
    script.write_text(SCRIPT.replace("--rollout-gpus=8", "--rollout-gpus=8 --engine-gpus=2")
                      .replace("#SBATCH -J my-rl", "#SBATCH -J my-rl\n#WEAVE --cooperative"))
    assert build_spec(script, {})[1].engine_gpus == 2
    assert build_spec(script, {"engine-gpus": 4})[1].engine_gpus == 4   # the flag wins
    sock = ["--socket", str(weaved.socket)]
    assert run_app(app, "weave-sbatch", [str(script), "--test-only", *sock]) == 0
    capsys.readouterr()
    assert run_app(app, "weave-sbatch", [str(script), "--test-only", "--engine-gpus", "3",
                                         *sock]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key 'gpus.engine' = 3" in err, err
    assert err.endswith("valid: 1, 2, 4, 8"), err


def test_sbatch_environment_defaults_sit_between_directives_and_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from weave_slurm.daemon.submission import env_options

    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.replace("#SBATCH -J my-rl", "#SBATCH -J my-rl -q low"))
    env = env_options({"SBATCH_QOS": "high", "SBATCH_TIMELIMIT": "1:00:00",
                       "SBATCH_PARTITION": "gpu"})             # weave picks partitions
    assert env == {"qos": "high", "time": 60}
    assert build_spec(script, env)[1].slurm.qos == "high"       # env beats #SBATCH
    assert build_spec(script, {**env, "qos": "top"})[1].slurm.qos == "top"   # flag wins
    with pytest.raises(ConfigError, match="environment SBATCH_TIMELIMIT: --time='soon'"):
        env_options({"SBATCH_TIMELIMIT": "soon"})
    monkeypatch.chdir(tmp_path)                                  # -D relative: from here
    assert build_spec(script, {"workdir": "runs"})[1].workdir == str(tmp_path / "runs")


def test_wrap_stdin_and_chdir_as_sbatch(weaved: Running, tmp_path: Path,  # noqa: F811
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--wrap CMD (a cooperative job named 'wrap'), a script on standard input (named
    'sbatch' unless it says -J), -D/--chdir; plain help ('H:M:S' is no emoji)."""
    import io

    sock = ["--socket", str(weaved.socket), "--test-only"]
    terms = ["--model-params-b", "0.5", "--rollout-gpus", "1", "--train-gpus", "1",
             "--max-tokens", "64", "--rollout-s", "1", "--train-s", "1"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    assert run_app(app, "weave-sbatch", ["--wrap", "python -c pass", *terms, *sock]) == 0
    assert "job 'wrap' would fit" in capsys.readouterr().out
    # -D is the job's directory, from the current one (weaved checks it is the user's)
    assert run_app(app, "weave-sbatch", ["--wrap", "true", "-D", "here", *terms, *sock]) == 2
    assert f"key 'workdir' = '{tmp_path / 'here'}'" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("#!/bin/sh\n#WEAVE --entry=builtin:grpo-toy\n"
                                                 "python train.py\n"))
    assert run_app(app, "weave-sbatch", [*terms, *sock]) == 0
    assert "job 'sbatch' would fit" in capsys.readouterr().out
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\necho\n")
    assert run_app(app, "weave-sbatch", [str(script), "--wrap", "true", *sock]) == 2
    assert "--wrap: give the command or a script" in capsys.readouterr().err
    assert run_app(app, "weave-sbatch", ["--help"]) == 0
    assert "H:M:S" in capsys.readouterr().out


def test_container_from_sbatch_directive_environment_and_flag(tmp_path: Path) -> None:
    from weave_slurm.daemon.submission import env_options

    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.replace("#SBATCH -J my-rl", "#SBATCH -J my-rl --container=/img/a"))
    assert build_spec(script, {})[1].slurm.container == "/img/a"      # sbatch's own flag
    env = env_options({"SBATCH_CONTAINER": "/img/b"})
    assert build_spec(script, env)[1].slurm.container == "/img/b"     # env beats #SBATCH
    assert build_spec(script, {**env, "container": "/img/c"})[1].slurm.container == "/img/c"
    script.write_text(SCRIPT.replace("#SBATCH -J my-rl", "#SBATCH --container=img"))
    with pytest.raises(ConfigError, match=r"slurm.container.*must be an absolute path"):
        build_spec(script, {})
