"""The site config's ``[runtime]`` table: weight transfer and long-tail migration."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.config.runtime import RuntimeConfig
from weave_slurm.config.site import parse_site
from weave_slurm.errors import ConfigError
from weave_slurm.runtime.transfer import TransferConfig

MINIMAL = """
[pools.rollout]
[pools.train]
"""


def test_runtime_defaults_to_the_shm_handoff() -> None:
    site = parse_site(MINIMAL)
    assert site.runtime == RuntimeConfig("auto", "full", 60.0, False, 0.25)
    assert TransferConfig.from_site(site.runtime) == TransferConfig()


def test_runtime_twotier_reaches_the_executor_config() -> None:
    site = parse_site(MINIMAL + "[runtime]\nweight_transfer = 'twotier'\nsync_mode = 'delta'\n"
                      "sync_timeout_s = 15\n")
    cfg = TransferConfig.from_site(site.runtime)
    assert (cfg.kind, cfg.mode, cfg.timeout_s) == ("twotier", "delta", 15.0)


def test_long_tail_migration_reaches_weaved_executor(tmp_path: Path) -> None:
    from weave_slurm.daemon.group_runtime import GroupRuntime
    from weave_slurm.daemon.service import DaemonConfig, Weaved

    site = tmp_path / "site.toml"
    site.write_text(MINIMAL + "[runtime]\nlong_tail_migration = true\ntail_fraction = 0.1\n"
                    "plan_from_measurements = false\n")
    assert parse_site(site.read_text()).runtime.long_tail_migration
    w = Weaved(DaemonConfig(state_dir=tmp_path / "state", site_path=site, runtime="rl"))
    try:
        assert isinstance(w.driver, GroupRuntime)
        cfg = w.driver.config.runner
        assert cfg.long_tail_migration and cfg.tail_fraction == 0.1
        assert not w.driver.config.plan_from_measurements
    finally:
        w.store.close()
        w.server.server_close()


@pytest.mark.parametrize(("text", "needle"), [
    ("[runtime]\nweight_transfer = 'nccl'\n",
     "'runtime.weight_transfer' = 'nccl': valid choices: auto, shm, twotier"),
    ("[runtime]\nsync_mode = 'partial'\n", "valid choices: delta, full"),
    ("[runtime]\nsync_timeout_s = 0\n", "'runtime.sync_timeout_s' = 0.0: must be > 0"),
    ("[runtime]\nweight_transfers = 'shm'\n", "unknown key 'runtime.weight_transfers'"),
    ("[runtime]\ntail_fraction = 1.5\n", "'runtime.tail_fraction' = 1.5: must be <= 0.99"),
    ("[runtime]\nlong_tail_migration = 'yes'\n", "runtime.long_tail_migration"),
    ("[runtime]\nplan_from_measurements = 1\n", "runtime.plan_from_measurements"),
    ("[runtime]\nrecent_jobs = -1\n", "'runtime.recent_jobs' = -1: must be >= 0"),
])
def test_bad_runtime_key_is_one_clear_line(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_site(MINIMAL + text, "site.toml")
    assert needle in str(err.value) and str(err.value).startswith("site.toml")
    assert "\n" not in str(err.value)


def test_transfer_config_in_code_is_checked_too() -> None:
    with pytest.raises(ConfigError, match="weight_transfer 'ib': valid: auto, shm, twotier"):
        TransferConfig("ib")
    with pytest.raises(ConfigError, match="sync_mode 'x': valid: full, delta"):
        TransferConfig("twotier", mode="x")


def test_device_switch_is_read_and_checked() -> None:
    from weave_slurm.runtime.member import RunnerConfig

    assert parse_site(MINIMAL).runtime.device_switch == "auto"
    site = parse_site(MINIMAL + "[runtime]\ndevice_switch = 'off'\n")
    assert RunnerConfig.from_site(site.runtime).device_switch == "off"
    with pytest.raises(ConfigError,
                       match=r"runtime.device_switch. = .gpu.: valid choices: auto, off, on"):
        parse_site(MINIMAL + "[runtime]\ndevice_switch = 'gpu'\n")


def test_recent_jobs_is_read() -> None:
    assert parse_site(MINIMAL).runtime.recent_jobs == 6
    assert parse_site(MINIMAL + "[runtime]\nrecent_jobs = 0\n").runtime.recent_jobs == 0
