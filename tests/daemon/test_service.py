"""weaved's service: the site it refuses before it places anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.daemon.service import DaemonConfig, Weaved
from weave_slurm.errors import ConfigError

MINIMAL = """
[pools.rollout]
[pools.train]
"""
REFUSED = ("key 'limits.colocation' = true: weaved cannot run co-located groups yet (a "
           "member whose rollout runs on its own training nodes; weave simulate models "
           "them); remove the key or set it to false")


def test_weaved_refuses_a_site_asking_for_colocation(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(MINIMAL + "[limits]\ncolocation = true\n")
    with pytest.raises(ConfigError) as err:
        Weaved(DaemonConfig(state_dir=tmp_path / "state", site_path=site))
    assert str(err.value) == f"{site}: {REFUSED}"


def test_weaved_places_no_colocated_group(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(MINIMAL + "[limits]\ncolocation = false\n")
    w = Weaved(DaemonConfig(state_dir=tmp_path / "state", site_path=site))
    try:
        assert w.capacity.colocation is False
    finally:
        w.store.close()
        w.server.server_close()


def test_config_check_refuses_colocation_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site.toml"
    site.write_text(MINIMAL + "[limits]\ncolocation = true\n")
    assert run_app(app, "weave", ["config", "check", str(site)]) == 2
    assert capsys.readouterr().err.strip() == f"weave: error: {site}: {REFUSED}"
