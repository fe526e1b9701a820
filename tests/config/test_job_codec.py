"""The typed job spec weaved stores (config/job_codec.py): every field comes back as it
was parsed, ``[options]`` tables and lists, ``[launch]`` and ``[slurm]`` included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weave_slurm.config.job import load_job, parse_job
from weave_slurm.config.job_codec import spec_from_json, spec_to_json
from weave_slurm.config.render import job_spec_toml

JOBS = sorted((Path(__file__).parents[2] / "configs" / "jobs").glob("*.toml"))


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_the_shipped_specs_come_back_as_parsed(path: Path) -> None:
    spec = load_job(path)
    assert spec_from_json(spec_to_json(spec)) == spec


def test_options_launch_slurm_and_code_come_back_as_parsed() -> None:
    text = job_spec_toml("coop", options={"task": "copy", "lrs": [1e-5, 2e-5], "n": 3,
                                          "engine": {"tp": 2, "tags": ["a", "b"],
                                                     "inner": {"on": True}}},
                         workdir="/home/a/proj", pythonpath=["/home/a/src", "/env"],
                         engine_gpus=1)
    text += ('\n[slurm]\naccount = "lab"\ntime_limit_min = 30\noutput = "%x-%j.out"\n'
             '\n[launch]\nrollout = "python r.py"\ntrain = "torchrun t.py"\n'
             '[launch.env]\nHOME = "/home/a"\n')
    spec = parse_job(text, "coop.toml")
    assert spec.launch is not None and spec.slurm.account == "lab"
    back = spec_from_json(spec_to_json(spec))
    assert back == spec and back.algorithm is spec.algorithm
    assert dict(back.options)["engine"] == dict(spec.options)["engine"]


def test_a_field_an_older_weaved_did_not_store_takes_its_default() -> None:
    spec = parse_job(job_spec_toml("a"))
    raw = json.loads(spec_to_json(spec))
    del raw["solo"], raw["slurm"]
    assert spec_from_json(json.dumps(raw)) == spec
