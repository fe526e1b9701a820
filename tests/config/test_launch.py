"""A cooperative job's spec: ``[launch]`` (config/launch.py), a weave-sbatch script whose
body runs (``#WEAVE --cooperative``, ``--rollout-cmd``/``--train-cmd``), the
submitter's environment, and where the runtime puts each role's output
(runtime/launch_plan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.daemon.submission import build_spec
from weave_slurm.errors import ConfigError
from weave_slurm.runtime.launch_plan import LaunchPlan, plan_for

HEADER = "#!/bin/bash\n#WEAVE --model-params-b=0.5 --rollout-gpus=8 --train-gpus=8 " \
         "--max-tokens=64\n"


def _spec(launch: str, **top: object) -> str:
    return job_spec_toml("coop", **top) + "\n[launch]\n" + launch  # type: ignore[arg-type]


def test_a_launch_table_makes_a_cooperative_job() -> None:
    spec = parse_job(_spec('rollout = "python r.py"\ntrain = "torchrun t.py"\n'
                           '[launch.env]\nHOME = "/home/a"\n'))
    assert spec.launch is not None
    assert (spec.launch.command("rollout"), spec.launch.command("train")) == \
        ("python r.py", "torchrun t.py")
    assert spec.launch.env == (("HOME", "/home/a"),)
    assert parse_job(job_spec_toml("hosted")).launch is None


@pytest.mark.parametrize(("launch", "top", "words"), [
    ('rollout = "python r.py"\n', {}, "no command for role train"),
    ('script = "echo"\n', {"staleness": 1}, "key 'staleness' = 1: a cooperative job"),
    ('script = "echo"\nwhat = 1\n', {}, "unknown key 'launch.what'"),
    ('script = "echo"\n[launch.env]\nWEAVE_JOB_ID = "7"\n', {}, "'launch.env.WEAVE_JOB_ID'"),
    ('script = "  "\n', {}, "key 'launch.script'"),
])
def test_a_bad_launch_table_is_refused_in_one_line(launch: str, top: dict[str, object],
                                                   words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_job(_spec(launch, **top))
    assert words in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_cooperative_script_runs_its_body_in_the_callers_environment(
        tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    body = HEADER + "#WEAVE --cooperative\npython -u my_rl.py --role $WEAVE_ROLE\n"
    script.write_text(body)
    environ = {"PATH": "/opt/venv/bin:/usr/bin", "HOME": "/home/alice",
               "WEAVE_NODE_SOCKET": "/elsewhere", "SLURM_JOB_ID": "9", "X": "a\"b\nc"}
    text, spec = build_spec(script, {}, environ)
    assert spec.launch is not None and spec.entry is None
    assert spec.launch.command("rollout") == spec.launch.command("train") == body
    assert dict(spec.launch.env) == {"PATH": "/opt/venv/bin:/usr/bin", "HOME": "/home/alice",
                                     "X": "a\"b\nc"}
    assert parse_job(text, str(script)) == spec   # the stored text says the same

    # one launcher line per role; the other role runs the body
    script.write_text(HEADER + "#WEAVE --rollout-cmd='python gen.py'\necho train\n")
    _, spec = build_spec(script, {})
    assert spec.launch is not None and spec.launch.command("rollout") == "python gen.py"
    assert spec.launch.command("train").endswith("echo train\n")
    assert spec.launch.env == ()           # no environment given: none kept

    # without a directive the body is not a cooperative job (the hosted jobs' scripts)
    script.write_text(HEADER + "echo hi\n")
    assert build_spec(script, {})[1].launch is None


def test_cooperative_directive_errors(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(HEADER + "#WEAVE --cooperative=maybe\necho\n")
    with pytest.raises(ConfigError, match=r"--cooperative='maybe': takes no value"):
        build_spec(script, {})
    spec = tmp_path / "job.toml"
    spec.write_text(job_spec_toml("t"))
    with pytest.raises(ConfigError, match=r"a spec names its commands in \[launch\]"):
        build_spec(spec, {"cooperative": True})


def test_the_plan_puts_output_files_as_sbatch_does() -> None:
    spec = parse_job(_spec('script = "echo"\n[launch.env]\nPYTHONPATH = "/env"\n',
                           workdir="/home/a/proj", pythonpath=["/home/a/src"])
                     .replace("\n[launch]", '\n[slurm]\noutput = "%x-%j.out"\n'
                              'error = "/logs/%u/%j.err"\n\n[launch]'))
    plan = plan_for(spec, "42", 0)
    assert plan is not None
    assert (plan.output, plan.error) == ("/home/a/proj/coop-42.out", "/logs/root/42.err")
    req = plan.request("train")
    assert req["command"] == "echo" and req["workdir"] == "/home/a/proj"
    assert req["env"]["PYTHONPATH"] == "/home/a/src:/env"
    assert req["env"]["WEAVE_JOB_NAME"] == "coop"
    # no [slurm] output: weave-%j.out in the working directory (the home without one)
    bare = parse_job(_spec('script = "echo"\n'))
    assert bare.launch is not None
    plan2 = LaunchPlan.build(bare.launch, bare.slurm, job_id="7", name="coop", user="a",
                             home="/home/a", workdir=None)
    assert (plan2.output, plan2.error, plan2.workdir) == ("/home/a/weave-7.out", None, None)


def test_a_cooperative_jobs_object_store_counts_on_both_nodes_and_reaches_its_processes(
        tmp_path: Path) -> None:
    from weave_slurm.config.site import default_site
    from weave_slurm.model.profile import profile_job

    spec = parse_job(_spec('script = "ray start"\nobject_store_gib = 0.5\n',
                           rollout_state_gib=1.0, train_state_gib=2.0))
    assert spec.launch is not None and spec.launch.object_store_gib == 0.5
    prof = profile_job(spec, default_site())
    assert (prof.rollout_state_gib, prof.train_state_gib) == (1.5, 2.5)
    plan = plan_for(spec, "42", 0)
    assert plan is not None
    assert plan.request("train")["env"]["WEAVE_OBJECT_STORE_BYTES"] == str(2**29)
    with pytest.raises(ConfigError, match=r"'launch\.object_store_gib'") as info:
        parse_job(_spec('script = "x"\nobject_store_gib = -1\n'))
    assert "\n" not in str(info.value)
    # a weave-sbatch script says it as a directive
    script = tmp_path / "job.sh"
    script.write_text(HEADER + "#WEAVE --cooperative --object-store-gib=0.25\nray start\n")
    launch = build_spec(script, {}, {"PATH": "/usr/bin"})[1].launch
    assert launch is not None and launch.object_store_gib == 0.25
