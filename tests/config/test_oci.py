"""config/oci.py: the site's oci.conf as Slurm reads it, its patterns, and the
submission's one-line refusals of a job's container."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.oci import (
    check_container,
    container_refusal,
    oci_conf_path,
    parse_oci_conf,
    read_oci_conf,
    runtime_argv,
)
from weave_slurm.errors import ConfigError

CONF = '''\
# a site's oci.conf (comments, quoting, keys in any case)
RunTimeQuery="runc --root=/run/x state %n.%u.%j.%s.%t"
runtimekill="runc --root=/run/x kill %n.%u.%j.%s.%t SIGTERM"
RunTimeDelete="runc --root=/run/x delete --force %n.%u.%j.%s.%t"   # after the task
RunTimeRun="runc --root=/run/x run --bundle %b %n.%u.%j.%s.%t # not a comment"
'''
SPEC = '''\
name = "c"
model = {{ params_b = 0.5 }}
gpus = {{ rollout = 8, train = 8 }}
rollout = {{ max_response_tokens = 64, prompts_per_step = 8, samples_per_prompt = 8 }}
{launch}
[slurm]
container = "{bundle}"
'''


def _bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text("{}")
    return bundle


def test_oci_conf_is_read_as_slurm_reads_it(tmp_path: Path) -> None:
    conf = parse_oci_conf(CONF, tmp_path / "oci.conf")
    assert conf.problem() is None
    assert conf.run == "runc --root=/run/x run --bundle %b %n.%u.%j.%s.%t # not a comment"
    assert conf.delete == "runc --root=/run/x delete --force %n.%u.%j.%s.%t"
    argv = runtime_argv(conf.delete, {"n": "h20-0", "u": "alice", "j": "7", "s": "weave3",
                                      "t": "train"})
    assert argv == ["runc", "--root=/run/x", "delete", "--force", "h20-0.alice.7.weave3.train"]
    assert runtime_argv("x %b %% %q", {"b": "/a b"}) == ["x", "/a b", "%", "%q"]


def test_oci_conf_beside_slurm_conf(tmp_path: Path) -> None:
    assert oci_conf_path({"SLURM_CONF": str(tmp_path / "slurm.conf")}) == tmp_path / "oci.conf"
    assert oci_conf_path({}) == Path("/etc/slurm/oci.conf")
    assert read_oci_conf(tmp_path / "oci.conf") is None
    (tmp_path / "oci.conf").write_text("RunTimeCreate=x\nRunTimeStart=y\n")
    conf = read_oci_conf(tmp_path / "oci.conf")
    assert conf is not None and "weave runs a container with RunTimeRun" in str(conf.problem())
    with pytest.raises(ConfigError, match=r"oci.conf:1: expected Key=value"):
        parse_oci_conf("RunTimeRun\n", tmp_path / "oci.conf")


def test_container_refusals_name_the_key_and_the_fix(tmp_path: Path) -> None:
    conf_path = tmp_path / "oci.conf"
    conf = parse_oci_conf(CONF, conf_path)
    bundle = _bundle(tmp_path)
    assert container_refusal(str(bundle), conf, conf_path) is None
    assert "absolute path" in str(container_refusal("bundle", conf, conf_path))
    assert "no such directory" in str(container_refusal(str(tmp_path / "x"), conf, conf_path))
    (bundle / "config.json").unlink()
    assert "has no config.json" in str(container_refusal(str(bundle), conf, conf_path))
    bundle = _bundle(tmp_path / "2")
    (bundle / "rootfs").rmdir()
    (bundle / "rootfs").symlink_to(tmp_path)
    assert "no rootfs/ directory" in str(container_refusal(str(bundle), conf, conf_path))
    why = container_refusal(str(_bundle(tmp_path / "3")), None, conf_path)
    assert why is not None and "no OCI runtime configured" in why and str(conf_path) in why
    assert "\n" not in why


def test_check_container_at_submission(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    conf_path = tmp_path / "oci.conf"
    coop = SPEC.format(launch='launch = { script = "echo hi" }', bundle=bundle)
    job = parse_job(coop, "job.toml")
    assert job.slurm.container == str(bundle)
    with pytest.raises(ConfigError, match=r"^job.toml: key 'slurm.container' = .*no OCI "
                                          r"runtime configured"):
        check_container(job, conf_path, "job.toml")
    conf_path.write_text(CONF)
    check_container(job, conf_path, "job.toml")
    check_container(parse_job(SPEC.format(launch="", bundle=bundle), "job.toml"), conf_path,
                    "job.toml")                                   # a hosted job too
    with pytest.raises(ConfigError, match=r"slurm.container.*absolute path"):
        parse_job(SPEC.format(launch="", bundle="rel/bundle"), "job.toml")
