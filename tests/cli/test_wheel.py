"""The package works from its wheel, without a clone (issue 17).

The wheel is built from a copy of the sources and installed into a fresh venv with only
what it declares (torch first, from local disk, then the wheel with -c constraints.txt:
no click, no repository on sys.path). Then, from a directory outside the repository:
``weave --help``, ``--version``, ``weave plan`` on the repo's job specs, a usage
mistake, and the templates and the SPANK source inside the installed package.
About 45 s on the CI machine, most of it installing torch.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"   # a CPU build on local disk; a bare requirement pulls CUDA

pytestmark = pytest.mark.slow


def _run(argv: Sequence[str | Path], cwd: Path, timeout_s: float = 600,
         ok: bool = True) -> subprocess.CompletedProcess[str]:
    # as a fresh shell would: no PYTHONPATH to put a checkout before the installed wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    res = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                         timeout=timeout_s, env=env)
    if ok:
        assert res.returncode == 0, f"{argv}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and its declared dependencies; its bin/ directory."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(REPO / "weave_slurm", src / "weave_slurm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", src, "-w", base / "dist"],
         cwd=base)
    (wheel,) = (base / "dist").glob("weave_slurm-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=base)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    _run([*pip, TORCH], cwd=base)
    _run([*pip, "-c", REPO / "constraints.txt", wheel], cwd=base)
    return venv / "bin"


def test_the_wheel_installs_no_click_and_runs(installed: Path, tmp_path: Path) -> None:
    py = installed / "python"
    assert _run([py, "-c", "import click"], tmp_path, ok=False).returncode != 0
    help_ = _run([installed / "weave", "--help"], tmp_path)
    assert "Usage:" in help_.stdout and "plan" in help_.stdout
    imported = _run([py, "-c", "import sys; sys.argv = ['weave', '--help']\n"
                     "from weave_slurm.cli.main import app\n"
                     "from weave_slurm.cli.error_lines import run_app\n"
                     "run_app(app, 'weave')\n"
                     "print([m for m in sys.modules if m.split('.')[0] == 'click'])"],
                    tmp_path)
    assert imported.stdout.strip().splitlines()[-1] == "[]"
    want = f"weave-slurm {version('weave-slurm')}\n"
    assert _run([installed / "weave", "--version"], tmp_path).stdout == want
    assert _run([installed / "weave-sbatch", "--version"], tmp_path).stdout == want


def test_weave_plan_on_the_repo_configs(installed: Path, tmp_path: Path) -> None:
    jobs = sorted(glob.glob(str(REPO / "configs" / "jobs" / "*.toml")))
    res = _run([installed / "weave", "plan", "--json", *jobs], tmp_path)
    summary = json.loads(res.stdout)
    assert len(summary["jobs"]) + len(summary["refused"]) == len(jobs)


def test_a_usage_mistake_is_one_line(installed: Path, tmp_path: Path) -> None:
    res = _run([installed / "weave", "status", "--bogus", "RUNNING"], tmp_path, ok=False)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("weave status: error: unrecognized option '--bogus'; valid: ")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_templates_and_spank_source_are_package_data(installed: Path, tmp_path: Path) -> None:
    res = _run([installed / "python", "-c",
                "import pathlib, weave_slurm\n"
                "from weave_slurm.slurm.backend import AllocationRequest, ResourceSpec\n"
                "from weave_slurm.slurm.templates import TEMPLATE_DIR, render_allocation\n"
                "from weave_slurm import spank\n"
                "print(pathlib.Path(weave_slurm.__file__).parent)\n"
                "print(TEMPLATE_DIR)\nprint(spank.source_dir())\n"
                "print(render_allocation(AllocationRequest('7', 'h20', "
                "(ResourceSpec('h20', 1, 8, 'h20', 4),))))"],
               tmp_path)
    pkg, templates, source = (Path(line) for line in res.stdout.splitlines()[:3])
    assert "site-packages" in pkg.parts and REPO not in pkg.parents
    assert templates == pkg / "sbatch_templates" and source == pkg / "spank"
    shipped = [templates / "allocation.sbatch", source / "weave.c", source / "Makefile"]
    # the repository's top-level sbatch_templates/ and spank/, as files in the wheel
    assert all(p.is_file() and not p.is_symlink() for p in shipped)
    assert "#SBATCH --partition=h20" in res.stdout   # rendered from the installed template
    assert _run([installed / "weave", "spank", "path"], tmp_path).stdout.strip() == str(source)


@pytest.mark.skipif(not Path("/usr/include/slurm/spank.h").is_file() or not shutil.which("gcc")
                    or not shutil.which("make"), reason="needs slurm/spank.h, gcc and make")
def test_weave_spank_build_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    res = _run([installed / "weave", "spank", "build", "--out", tmp_path / "so"], tmp_path)
    so = tmp_path / "so" / "weave.so"
    assert so.is_file() and f"optional {so} sockdir=/run/weave" in res.stdout


def test_the_systemd_unit_and_the_metrics_dependency(installed: Path, tmp_path: Path) -> None:
    unit = _run([installed / "weave", "daemon", "--print-unit"], tmp_path).stdout
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    python = exec_start.removeprefix("ExecStart=").split()[0]
    assert Path(python).parent == installed and "@PYTHON@" not in unit, exec_start
    assert exec_start.endswith(" -m weave_slurm.cli daemon --backend slurm \\")
    res = _run([python, "-c", "import prometheus_client, weave_slurm.daemon.metrics; "
                "print(prometheus_client.__file__)"], tmp_path)
    assert str(installed.parent) in res.stdout     # declared, so installed with the wheel
