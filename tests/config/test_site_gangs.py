"""``[runtime] gangs``: a site file and the built-in site train every rank a layout
places; the CPU smoke site of the tests says ``gangs = false`` unless a test says
``gangs`` itself (a layout of more than one rank is then refused at submission)."""

from __future__ import annotations

import pytest

from tests.harness.weaved import smoke_site
from weave_slurm.config.site import default_site, parse_site
from weave_slurm.errors import ConfigError

MINIMAL = """
[pools.rollout]
[pools.train]
"""


def test_a_site_file_and_the_built_in_site_train_every_rank() -> None:
    assert parse_site(MINIMAL).runtime.gangs is True
    assert default_site().runtime.gangs is True
    assert parse_site(MINIMAL + "[runtime]\ngangs = false\n").runtime.gangs is False
    assert parse_site(MINIMAL + "[runtime]\ngangs = true\n").runtime.gangs is True


def test_gangs_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError) as err:
        parse_site(MINIMAL + "[runtime]\ngangs = 1\n", "site.toml")
    assert str(err.value) == "site.toml: key 'runtime.gangs' = 1: must be a boolean"


def test_smoke_site_adds_gangs_under_an_existing_runtime_table() -> None:
    text = MINIMAL + "[runtime]\nsync_mode = 'delta'\n\n[limits]\n"
    got = smoke_site(text)
    assert got == MINIMAL + "[runtime]\ngangs = false\nsync_mode = 'delta'\n\n[limits]\n"
    runtime = parse_site(got).runtime
    assert runtime.gangs is False and runtime.sync_mode == "delta"


def test_smoke_site_appends_a_runtime_table_when_there_is_none() -> None:
    got = smoke_site(MINIMAL)
    assert got == "[pools.rollout]\n[pools.train]\n\n[runtime]\ngangs = false\n"
    assert parse_site(got).runtime.gangs is False
    assert smoke_site() == "[runtime]\ngangs = false\n"


@pytest.mark.parametrize("gangs", ["true", "false"])
def test_smoke_site_leaves_a_site_that_sets_gangs_alone(gangs: str) -> None:
    text = MINIMAL + f"[runtime]\nsync_mode = 'delta'\ngangs = {gangs}\n"
    assert smoke_site(text) == text
    assert parse_site(smoke_site(text)).runtime.gangs is (gangs == "true")
