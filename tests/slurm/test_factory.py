"""make_backend: known kinds, unknown kinds, and pyslurm refused with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.cli_backend import SlurmCliBackend
from weave_slurm.slurm.factory import check_pyslurm, make_backend
from weave_slurm.slurm.fake_runner import FakeReply, FakeRunner
from weave_slurm.slurm.local_backend import LocalBackend


def test_kinds(tmp_path: Path) -> None:
    assert isinstance(make_backend("local", state_dir=tmp_path), LocalBackend)
    assert isinstance(make_backend("slurm", runner=FakeRunner()), SlurmCliBackend)


def test_unknown_kind_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'nope'.*\['local', 'slurm', 'pyslurm'\]"):
        make_backend("nope")


def test_pyslurm_is_refused_with_a_reason() -> None:
    fake = FakeRunner()
    fake.on(["sinfo", "--version"], FakeReply(stdout="slurm-wlm 22.05.8\n"))
    with pytest.raises(ConfigError, match=r"pyslurm.*refused.*use backend 'slurm'"):
        make_backend("pyslurm", runner=fake)


def test_pyslurm_version_mismatch_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    fake_mod = types.ModuleType("pyslurm")
    fake_mod.__version__ = "25.11.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyslurm", fake_mod)
    fake = FakeRunner()
    fake.on(["sinfo", "--version"], FakeReply(stdout="slurm-wlm 22.05.8\n"))
    assert "'25.11.0' does not match the running Slurm '22.05.8'" in check_pyslurm(fake)
    fake_mod.__version__ = "22.5.1"  # type: ignore[attr-defined]
    assert "no backend yet" in check_pyslurm(fake)
