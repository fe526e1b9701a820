"""The examples of docs/job_api.md and docs/recipes.md run on CPU (issue 30: a broken
example fails a test). A block that needs more (a GPU, verl, the Slurm cluster) is marked
skip in the page with its reason.

One test id per block of the page (of each page of :data:`PAGES`):

- a Python block that starts with ``# <path>.py`` is a module of the user's: it is
  written to that path (under one directory for the page) and imported by a new
  interpreter; the other Python blocks run as scripts in that directory, after the
  modules are written. A fragment that leaves names to the reader (``rollout_runner``,
  ``llm`` ...) runs after a prelude that defines them (:data:`PRELUDES`). The listing of
  the ``RLJob`` protocol must be the protocol's methods and types.
- A TOML block is a spec, or tables of one: it is laid over a shipped spec (its top
  keys replacing the spec's) and must pass ``weave config check`` with the example site.
- A ``#WEAVE`` script becomes the spec weave-sbatch makes of it (``build_spec``), which
  must pass ``weave config check`` too.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.docs.blocks import REPO, DocBlock, doc_blocks
from weave_slurm.daemon.submission import build_spec, to_toml
from weave_slurm.workloads import api

pytestmark = pytest.mark.torch

#: The pages whose examples run here (docs/recipes.md's Ray pattern runs in a cooperative
#: job on the Slurm cluster: tests/daemon/test_ray_slurm.py).
PAGES = ("docs/job_api.md", "docs/recipes.md")
SITE = REPO / "configs" / "site.example.toml"
BASE_SPEC = REPO / "configs" / "jobs" / "qwen7b-grpo-8k.toml"
MODULE = re.compile(r"^# (\S+\.py)\b")
PRELUDES = {
    "rollout_runner": """\
from weave_slurm.workloads.api import JobContext, Role
from weave_slurm.workloads.entry import start_job
rollout_runner = start_job("my_pkg.bandit:BanditJob", JobContext("b", Role.ROLLOUT, seed=0))
train_runner = start_job("my_pkg.bandit:BanditJob", JobContext("b", Role.TRAIN, seed=0))
""",
    "llm": """\
from types import SimpleNamespace
import torch
llm = SimpleNamespace(sleep=lambda level: None, wake_up=lambda: None)
steps = 2
def generate(*args):
    return SimpleNamespace(reward=torch.rand(8))
""",
}
BLOCKS = [p for page in PAGES for p in doc_blocks(page, {"python", "toml", "bash", "sh"})]


def _module_path(block: DocBlock) -> str | None:
    m = MODULE.match(block.code)
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pages' directory: every module block written to the path it names."""
    root = tmp_path_factory.mktemp("job_api")
    for param in BLOCKS:
        block = param.values[0]
        rel = _module_path(block) if block.syntax == "python" else None
        if rel:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(block.code)
    return root


def _python(args: list[str], cwd: Path, what: DocBlock) -> None:
    res = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, (f"{what.where} ({what.section}): exit {res.returncode}\n"
                                 f"{what.code}\n--- stderr ---\n{res.stderr[-4000:]}")


def _config_check(spec_text: str, where: Path, what: DocBlock) -> None:
    spec = where / "spec.toml"
    spec.write_text(spec_text)
    _python(["-m", "weave_slurm.cli", "config", "check", str(SITE), str(spec)], where, what)


def _hints(cls: type) -> dict[str, dict[str, Any]]:
    """Each public method's parameter and return types (api.py names Tensor for mypy only)."""
    names = {"Tensor": torch.Tensor}
    return {name: typing.get_type_hints(fn, localns=names) for name, fn in inspect.getmembers(cls)
            if inspect.isfunction(fn) and not name.startswith("_")}


def _check_protocol_listing(block: DocBlock) -> None:
    ns: dict[str, Any] = {k: v for k, v in vars(api).items() if k != "RLJob"}
    exec(block.code, {**ns, "Tensor": torch.Tensor}, ns)
    assert _hints(ns["RLJob"]) == _hints(api.RLJob), f"{block.where}: not api.RLJob"


@pytest.mark.parametrize("block", [p for p in BLOCKS if p.values[0].syntax == "python"])
def test_python_example(examples: Path, block: DocBlock) -> None:
    if block.importorskip:
        pytest.importorskip(block.importorskip)
    if "class RLJob(Protocol)" in block.code:
        _check_protocol_listing(block)
        return
    rel = _module_path(block)
    if rel:
        _python(["-c", f"import {rel.removesuffix('.py').replace('/', '.')}"], examples, block)
        return
    preludes = [code for name, code in PRELUDES.items() if re.search(rf"\b{name}\b", block.code)]
    script = examples / f"example_{block.lineno}.py"
    script.write_text("".join(preludes) + block.code)
    _python([script.name], examples, block)


@pytest.mark.parametrize("block", [p for p in BLOCKS if p.values[0].syntax == "toml"])
def test_toml_example(tmp_path: Path, block: DocBlock) -> None:
    spec = {**tomllib.loads(BASE_SPEC.read_text()), **tomllib.loads(block.code)}
    _config_check(to_toml(spec), tmp_path, block)


@pytest.mark.parametrize("block", [p for p in BLOCKS if p.values[0].syntax in ("bash", "sh")])
def test_script_example(tmp_path: Path, block: DocBlock) -> None:
    assert block.code.startswith("#!") and "#WEAVE" in block.code, (
        f"{block.where}: a command block of this page needs a skip mark with its reason")
    script = tmp_path / "job.sh"
    script.write_text(block.code)
    spec_text, _ = build_spec(script, {})
    _config_check(spec_text, tmp_path, block)


TEMPLATES = {"hosted-grpo.sh": ("builtin:grpo-toy", "grpo-toy"),
             "trl-grpo.sh": ("builtin:trl-grpo-tiny", "trl-grpo"),
             "cooperative.sh": (None, "coop")}


def test_every_script_template_is_here() -> None:
    assert {p.name for p in (REPO / "sbatch_templates").glob("*.sh")} == set(TEMPLATES)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_shipped_script_template_is_a_valid_job(name: str, tmp_path: Path) -> None:
    """The `#WEAVE` script templates (sbatch_templates/*.sh) as weave-sbatch reads them;
    README's separate-hosts path submits each (tests/docs/test_readme_run.py)."""
    spec_text, spec = build_spec(REPO / "sbatch_templates" / name, {})
    assert (spec.entry, spec.name) == TEMPLATES[name]
    assert (spec.launch is not None) == (name == "cooperative.sh")
    block = DocBlock(f"sbatch_templates/{name}", "", 1, "bash", spec_text, None)
    _config_check(spec_text, tmp_path, block)
