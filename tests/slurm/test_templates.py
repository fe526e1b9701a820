"""sbatch templates: golden files, strict rendering, valid shell.

Regenerate the golden files after an intended change with WEAVE_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.backend import AllocationRequest, ResourceSpec
from weave_slurm.slurm.command_runner import run_command
from weave_slurm.slurm.templates import (
    ALLOCATION_TEMPLATE,
    check_allocation_template,
    render,
    render_allocation,
)

GOLDEN = Path(__file__).parent / "golden"
H20 = ResourceSpec("h20", 2, 8, "h20", 16)
H800 = ResourceSpec("h800", 1, 8, "h800", 32)

HOLD = ("/opt/weave/bin/python", "-m", "weave_slurm.cli.node", "hold")   # not this machine's
CASES = {
    "allocation_h20.sbatch": lambda: render_allocation(
        AllocationRequest("7", "h20", (H20,), time_limit_min=240), output="/var/log/w/%j.out",
        hold=HOLD),
    "allocation_het.sbatch": lambda: render_allocation(
        AllocationRequest("8", "het", (H20, H800)), hold=HOLD),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    text = CASES[name]()
    path = GOLDEN / name
    if os.environ.get("WEAVE_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; WEAVE_UPDATE_GOLDEN=1 to accept"
    run_command(["bash", "-n", str(path)])


def test_rendering_is_strict(tmp_path: Path) -> None:
    (tmp_path / "t.sh").write_text("echo @@{a} $HOME\n")
    assert render(tmp_path / "t.sh", {"a": "1"}) == "echo 1 $HOME\n"
    with pytest.raises(ConfigError, match=r"missing values \['a'\]"):
        render(tmp_path / "t.sh", {})
    with pytest.raises(ConfigError, match=r"unknown values \['b'\]"):
        render(tmp_path / "t.sh", {"a": "1", "b": "2"})
    with pytest.raises(ConfigError, match=r"nope\.sh' cannot be read"):
        render(tmp_path / "nope.sh", {})


def test_a_sites_template_must_use_every_placeholder(tmp_path: Path) -> None:
    """A site's own allocation script: the shipped one with a line added is fine; one
    without the comment (how a restarted weaved finds its allocations) is refused at
    load, naming the file and the missing placeholder."""
    check_allocation_template(ALLOCATION_TEMPLATE)
    site = tmp_path / "alloc.sbatch"
    site.write_text(ALLOCATION_TEMPLATE.read_text().replace(
        "exec @@{hold_command}", "module load cuda\nexec @@{hold_command}"))
    check_allocation_template(site)
    assert "module load cuda" in render_allocation(AllocationRequest("7", "h20", (H20,)),
                                                   template=site)
    site.write_text(ALLOCATION_TEMPLATE.read_text().replace("@@{comment}", "x@@{extra}"))
    with pytest.raises(ConfigError, match=r"alloc\.sbatch'.*missing placeholders "
                                          r"\['comment'\], unknown placeholders \['extra'\]"):
        check_allocation_template(site)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="group_id"):
        render_allocation(AllocationRequest("bad id", "h20", (H20,)))


def test_a_gpu_share_is_asked_as_gres_of_the_node_never_exclusive() -> None:
    """A share row (4 of an h20 node's 8 GPUs, daemon/allocplan.py "Shares") in the
    shipped script: the GPUs and CPUs it holds per node, nothing that takes the node."""
    text = render_allocation(AllocationRequest("9", "h20-1", (
        ResourceSpec("h20", 1, 4, "h20", 1),)), hold=HOLD)
    lines = [line for line in text.splitlines() if line.startswith("#SBATCH --")]
    assert lines[3:] == ["#SBATCH --partition=h20", "#SBATCH --nodes=1",
                         "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=1",
                         "#SBATCH --gres=gpu:h20:4"]
    assert "exclusive" not in text and "--mem" not in text
