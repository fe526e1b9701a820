from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from weave_slurm.config.fairshare import FairShareConfig, JobLimits
from weave_slurm.config.runtime import RuntimeConfig
from weave_slurm.config.site import (
    LimitsConfig,
    ModelConfig,
    NetworkConfig,
    SlurmConfig,
    default_site,
    load_site,
    parse_site,
)
from weave_slurm.errors import ConfigError
from weave_slurm.vocab import Pool

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
[pools.rollout]
[pools.train]
"""


def test_example_site_loads_with_paper_defaults() -> None:
    site = load_site(ROOT / "configs" / "site.example.toml")
    assert site.rollout.partition == "h20" and site.train.partition == "h800"
    ratio = site.train.price_per_gpu_hour / site.rollout.price_per_gpu_hour
    assert ratio == pytest.approx(2.85, rel=1e-3)
    assert site.network.inter_pool_gbps == 20 and site.network.intra_pool_gbps == 400
    assert site.pool(Pool.ROLLOUT).gpus_per_node == 8


def _sections(text: str) -> dict[str, set[str]]:
    """The keys the example names under each table, set or commented out."""
    out: dict[str, set[str]] = {}
    table = ""
    for line in text.splitlines():
        if m := re.match(r"^#?\s*\[([a-z_.]+)\]", line):
            table = m.group(1)
        elif m := re.match(r"^#?\s*([a-z_][a-z0-9_]*)\s*=", line):
            out.setdefault(table, set()).add(m.group(1))
    return out


def test_example_site_names_every_key_with_its_default() -> None:
    """configs/site.example.toml says it lists every key: each field of each table's
    config is there (set to its default, or commented out where unset is the default)."""
    text = (ROOT / "configs" / "site.example.toml").read_text()
    named = _sections(text)
    tables = {"runtime": RuntimeConfig, "limits": LimitsConfig, "model": ModelConfig,
              "network": NetworkConfig, "slurm": SlurmConfig, "fairshare": FairShareConfig,
              "limits.user": JobLimits}
    inner = {"limits": {"user", "account"},                   # tables of their own
             "fairshare": {"enabled", "users", "accounts"}}   # derived; tables
    for table, cls in tables.items():
        keys = {f.name for f in fields(cls)} - inner.get(table, set())
        missing = keys - named.get(table, set())
        assert not missing, f"[{table}] lacks {sorted(missing)}"
    site = load_site(ROOT / "configs" / "site.example.toml")
    runtime = tomllib.loads(text)["runtime"]
    assert {k: getattr(site.runtime, k) for k in runtime} == \
        {k: getattr(RuntimeConfig(), k) for k in runtime}   # each one its default


def test_reference_site_prices_h20_node_at_a_third() -> None:
    site = load_site(ROOT / "configs" / "reference.toml")
    assert site.rollout.price_per_node_hour * 3 == pytest.approx(site.train.price_per_node_hour)
    assert site.limits.max_group_size == 3


def test_minimal_site_takes_defaults() -> None:
    site = parse_site(MINIMAL)
    assert site.rollout == default_site().rollout


@pytest.mark.parametrize(("text", "needle"), [
    (MINIMAL + "[pools.bogus]\n", "unknown pool '[pools.bogus]'"),
    ("[pools.rollout]\n", "missing required table '[pools.train]'"),
    (MINIMAL.replace("[pools.train]", "[pools.train]\ngpus_per_node = -8"),
     "'pools.train.gpus_per_node' = -8: must be > 0"),
    (MINIMAL.replace("[pools.train]", "[pools.train]\ngpus_per_node = 'eight'"),
     "must be an integer"),
    (MINIMAL.replace("[pools.train]", "[pools.train]\ngpu = 'v100'"),
     "valid choices: a100, h100, h20, h800"),
    (MINIMAL + "[site]\ndefault_slo = 0.5\n", "'site.default_slo' = 0.5: must be >= 1"),
    (MINIMAL + "[limits]\nmax_group_sise = 3\n", "unknown key 'limits.max_group_sise'"),
    (MINIMAL + "[network]\ninter_pool_gbps = 0\n", "must be > 0"),
    ("[pools.rollout\n", "invalid TOML"),
    (MINIMAL.replace("[pools.train]", "[pools.train]\npartition = 'h20'"),
     "'pools.rollout.partition' and 'pools.train.partition' are both 'h20'; the rollout "
     "and training pools must be two different Slurm partitions"),
])
def test_bad_site_is_one_clear_line(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_site(text, "site.toml")
    message = str(err.value)
    assert needle in message
    assert message.startswith("site.toml")
    assert "\n" not in message


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: file not found"):
        load_site(tmp_path / "nope.toml")


def test_custom_gpu_kind() -> None:
    text = MINIMAL.replace("[pools.rollout]", "[pools.rollout]\ngpu = 'l40s'") + (
        "[gpus.l40s]\nhbm_gib = 48\nhbm_tbps = 0.864\nbf16_tflops = 362\n")
    assert parse_site(text).rollout.gpu.hbm_gib == 48


def test_colocation_is_unset_by_default_and_read_as_a_boolean() -> None:
    assert parse_site(MINIMAL).limits.colocation is None
    off = parse_site(MINIMAL + "[limits]\ncolocation = false\n")
    assert off.limits.colocation is False
    on = parse_site(MINIMAL + "[limits]\ncolocation = true\n")
    assert on.limits.colocation is True
    with pytest.raises(ConfigError, match=r"'limits.colocation'.* must be a boolean"):
        parse_site(MINIMAL + "[limits]\ncolocation = 'yes'\n", "site.toml")


def test_rollout_sharing_is_pooled_by_default_where_gangs_run_and_one_of_two_words() -> None:
    assert parse_site(MINIMAL).limits.rollout == "pooled"
    assert parse_site(MINIMAL + "[limits]\nmax_group_size = 3\n").limits.rollout == "pooled"
    one_process = "[runtime]\ngangs = false\n"
    assert parse_site(MINIMAL + one_process).limits.rollout == "pinned"
    assert parse_site(MINIMAL + "[limits]\nmax_group_size = 3\n" + one_process
                      ).limits.rollout == "pinned"
    assert parse_site(MINIMAL + "[limits]\nrollout = 'pinned'\n").limits.rollout == "pinned"
    assert parse_site(MINIMAL + "[limits]\nrollout = 'pooled'\n").limits.rollout == "pooled"
    with pytest.raises(ConfigError, match=r"'limits.rollout'.*valid choices: pinned, pooled"):
        parse_site(MINIMAL + "[limits]\nrollout = 'shared'\n", "site.toml")
    with pytest.raises(ConfigError, match=r"site.toml: \[limits\] rollout = 'pooled' with "
                       r"\[runtime\] gangs = false.*valid: gangs = true"):
        parse_site(MINIMAL + "[limits]\nrollout = 'pooled'\n[runtime]\ngangs = false\n",
                   "site.toml")
