"""The site's ``[slurm]`` table: what allocations are charged to."""

from __future__ import annotations

import pytest

from weave_slurm.config.site import MAX_TIME_LIMIT_MIN, SlurmConfig, parse_site
from weave_slurm.errors import ConfigError

MINIMAL = "[pools.rollout]\n[pools.train]\n"


def test_no_slurm_table_charges_slurm_defaults() -> None:
    assert parse_site(MINIMAL).slurm == SlurmConfig(None, None, None)


def test_slurm_table_is_read() -> None:
    site = parse_site(MINIMAL + '[slurm]\naccount = "rl-lab"\nqos = "normal"\n'
                      "time_limit_min = 1440\n")
    assert site.slurm == SlurmConfig("rl-lab", "normal", 1440)


def test_keys_are_optional_each() -> None:
    site = parse_site(MINIMAL + '[slurm]\nqos = "high"\n')
    assert site.slurm == SlurmConfig(None, "high", None)


@pytest.mark.parametrize(("body", "needle"), [
    ('account = "a b"', "key 'slurm.account' = 'a b': must be a Slurm name of 1-64 letters"),
    ('qos = "x;rm"', "key 'slurm.qos' = 'x;rm': must be a Slurm name"),
    ('account = ""', "key 'slurm.account' = '': must be a Slurm name"),
    ("account = 3", "key 'slurm.account' = 3: must be a string"),
    ("time_limit_min = 0", "key 'slurm.time_limit_min' = 0: must be minutes between 1 and "
     f"{MAX_TIME_LIMIT_MIN}"),
    (f"time_limit_min = {MAX_TIME_LIMIT_MIN + 1}", "must be minutes between 1 and"),
    ('time_limit_min = "1-00:00:00"', "key 'slurm.time_limit_min' = '1-00:00:00': must be an "
     "integer"),
    ("time_limit_min = 1.5", "must be an integer"),
    ('partition = "h20"', "slurm.partition"),
])
def test_bad_slurm_keys_are_one_line_naming_file_and_key(body: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_site(MINIMAL + "[slurm]\n" + body + "\n", "site.toml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("site.toml: ")
    assert needle in message, message


def test_unknown_key_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="account, allocation_template, qos, time_limit_min"):
        parse_site(MINIMAL + '[slurm]\nacount = "x"\n', "site.toml")
