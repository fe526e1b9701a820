"""weaved's service: the site's co-location, as weaved places with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.daemon.service import DaemonConfig, Weaved

MINIMAL = """
[pools.rollout]
[pools.train]
"""


@pytest.mark.parametrize(("limits", "on"), [("", False), ("colocation = false\n", False),
                                             ("colocation = true\n", True)])
def test_weaved_places_with_the_sites_colocation_off_unless_set(
        tmp_path: Path, limits: str, on: bool) -> None:
    site = tmp_path / "site.toml"
    site.write_text(MINIMAL + "[limits]\n" + limits)
    w = Weaved(DaemonConfig(state_dir=tmp_path / "state", site_path=site))
    try:
        assert w.capacity.colocation is on
        assert w.reconciler.placer.capacity.colocation is on
        replanner = w.reconciler.replanner   # running jobs keep their way
        assert replanner is not None and replanner.capacity.colocation is False
    finally:
        w.store.close()
        w.server.server_close()


def test_config_check_takes_a_site_with_colocation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site.toml"
    site.write_text(MINIMAL + "[limits]\ncolocation = true\n")
    assert run_app(app, "weave", ["config", "check", str(site)]) == 0
    assert capsys.readouterr().out.startswith(f"{site}: ok (rollout: h20 ")
