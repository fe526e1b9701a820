"""``[fairshare]`` and ``[limits.user]``/``[limits.account]`` in a site file."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.config.fairshare import JobLimits
from weave_slurm.config.site import load_site
from weave_slurm.errors import ConfigError

ROOT = Path(__file__).parents[2]
BASE = (ROOT / "configs" / "site.example.toml").read_text()


def _site(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(BASE.replace("[limits]\n", f"[limits]\n{extra}\n", 1)
                    if extra.startswith("#limits") else BASE + "\n" + extra)
    return path


def test_the_example_site_has_neither_and_limits_nobody() -> None:
    site = load_site(ROOT / "configs" / "site.example.toml")
    assert not site.fairshare.enabled
    assert site.limits.user == site.limits.account == JobLimits()


def test_tables_read_with_slurms_defaults(tmp_path: Path) -> None:
    site = load_site(_site(tmp_path, "[fairshare]\nweight_age = 10\n[fairshare.users]\n"
                           "alice = 2\n[fairshare.accounts]\nphys = 3\n"
                           "[limits.user]\nmax_pending = 5\nmax_running = 2\n"
                           "[limits.account]\nsubmissions_per_minute = 30\n"))
    fs = site.fairshare
    assert fs.enabled and fs.half_life_h == fs.max_age_h == 168.0 and fs.weight_age == 10
    assert fs.share("user", "alice") == 2 and fs.share("user", "bob") == 1
    assert fs.share("account", "phys") == 3
    assert site.limits.user == JobLimits(max_pending=5, max_running=2)
    assert site.limits.account == JobLimits(submissions_per_minute=30)


@pytest.mark.parametrize(("extra", "needle"), [
    ("[fairshare]\nhalflife = 3\n", "unknown key 'fairshare.halflife'"),
    ("[fairshare.users]\nalice = 0\n", "key 'fairshare.users.alice' = 0.0: must be > 0"),
    ("[limits.user]\nmax_running = 0\n", "key 'limits.user.max_running' = 0: must be >= 1"),
    ("[limits.account]\nmax_jobs = 3\n", "unknown key 'limits.account.max_jobs'"),
])
def test_bad_keys_are_one_line_naming_them(tmp_path: Path, extra: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        load_site(_site(tmp_path, extra))
