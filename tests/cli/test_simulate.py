"""``weave simulate``'s co-location flags: weave's default (on unless the site sets it
false) and weave-live's, weaved's (the site's ``[limits] colocation``, unset off), and
``--colocation`` with weave-live replaying weaved's rules instead of being refused."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from unittest import mock

import pytest

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app
from weave_slurm.config.site import load_site
from weave_slurm.sim.accounting import REFERENCE_SITE_TOML, reference_site

#: The reference site with weaved's co-location on and one process a member (docs).
COLOCATION_SITE = Path(__file__).parents[2] / "configs" / "reference-colocation.toml"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("simulate") / "t.toml"
    assert run_app(app, "weave", ["trace", "generate", str(src), "--jobs", "12", "--mix",
                                  "synthetic-train-heavy", "--slo-dist",
                                  "uniform:1.0,1.2"]) == 0
    return src


def _site(tmp_path: Path, extra: str) -> Path:
    assert REFERENCE_SITE_TOML.rstrip().splitlines()[-3] == "[limits]"   # appended to it
    path = tmp_path / "site.toml"
    path.write_text(REFERENCE_SITE_TOML + extra, encoding="utf-8")
    return path


def _colocated(trace: Path, tmp_path: Path, *flags: str) -> tuple[dict[str, bool],
                                                                   dict[str, int]]:
    """Whether each policy replayed with co-location, and its co-located admissions."""
    out = tmp_path / "r.json"
    assert run_app(app, "weave", ["simulate", str(trace), "--policy", "weave,weave-live",
                                  "--accounting", "consistent", "--no-verify",
                                  "--json", str(out), *flags]) == 0
    report = json.loads(out.read_text())
    return report["site"]["colocation"], {n: p["admissions"]["colocated"]
                                          for n, p in report["policies"].items()}


def test_weave_live_follows_the_sites_colocation_as_weaved(trace: Path,
                                                            tmp_path: Path) -> None:
    on, counts = _colocated(trace, tmp_path)   # reference site: [limits] colocation unset
    assert on == {"weave": True, "weave-live": False}
    assert counts["weave"] > 0 and counts["weave-live"] == 0
    # one process a member ([runtime] gangs off): weaved may co-locate these jobs
    site = COLOCATION_SITE
    on, counts = _colocated(trace, tmp_path, "--site", str(site))
    assert on == {"weave": True, "weave-live": True} and counts["weave-live"] > 0
    on, counts = _colocated(trace, tmp_path, "--site", str(site), "--no-colocation")
    assert on == {"weave": False, "weave-live": False} and counts["weave-live"] == 0
    site = _site(tmp_path, "colocation = false\n\n[runtime]\ngangs = false\n")
    on, counts = _colocated(trace, tmp_path, "--site", str(site), "--colocation")
    assert on == {"weave": True, "weave-live": True} and counts["weave-live"] > 0


def test_colocation_with_weave_live_on_a_gangs_site_colocates_no_whole_node_job(
        trace: Path, tmp_path: Path) -> None:
    # --colocation is taken (it was refused); every trace job trains on a whole 8-GPU
    # node, 8 ranks under gangs, which weaved's runtime does not run co-located
    on, counts = _colocated(trace, tmp_path, "--colocation")
    assert on == {"weave": True, "weave-live": True}
    assert counts["weave"] > 0 and counts["weave-live"] == 0


def test_colocation_help_says_weave_live_follows_weaved(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    with mock.patch.dict(os.environ, {"COLUMNS": "400"}):
        assert run_app(app, "weave", ["simulate", "--help"]) == 0
    text = re.sub(r"[\s│]+", " ", capsys.readouterr().out)
    assert ("Default: the site's [limits] colocation, else on; weave-live as weaved: the "
            "site's, else off, and with weaved's rules (co-located groups closed, running "
            "jobs re-planned without co-location, no job of more than one training rank "
            "on a [runtime] gangs site") in text


def test_the_colocation_site_is_the_reference_site_with_one_rank_members() -> None:
    site = load_site(COLOCATION_SITE)
    assert site.limits.colocation is True and site.runtime.gangs is False
    ref = reference_site()
    assert (site.rollout, site.train, site.limits.max_group_size) == (
        ref.rollout, ref.train, ref.limits.max_group_size)
