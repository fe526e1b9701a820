"""What an allocation is charged to: the allocation script's --account/--qos/--time
directives (what weaved submits with sbatch) and the local backend's record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.backend import AllocationRequest, ResourceSpec
from weave_slurm.slurm.local_backend import STATE_FILE, LocalBackend
from weave_slurm.slurm.templates import render_allocation

H20 = ResourceSpec("h20", 1, 8, "h20", 2)


@pytest.mark.parametrize(("key", "value"), [("account", "a b"), ("qos", "x;y"), ("qos", "")])
def test_a_bad_name_is_refused_before_sbatch(key: str, value: str) -> None:
    req = AllocationRequest("3", "h20-0", (H20,), **{key: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"{key}={value!r}; use 1-64 letters"):
        req.validate()


def test_the_allocation_script_carries_account_qos_and_time() -> None:
    text = render_allocation(AllocationRequest("3", "h20-0", (H20,), time_limit_min=5,
                                               account="rl-lab", qos="high"))
    assert "#SBATCH --time=5\n#SBATCH --account=rl-lab\n#SBATCH --qos=high\n" in text
    plain = render_allocation(AllocationRequest("3", "h20-0", (H20,)))
    assert not any(flag in plain for flag in ("--time", "--account", "--qos"))


def test_the_local_backend_records_them(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    alloc = backend.allocate(AllocationRequest("3", "h20-0", (H20,), time_limit_min=9,
                                               account="rl-lab", qos="normal"))
    rec = json.loads((tmp_path / STATE_FILE).read_text())["allocations"][alloc.alloc_id]
    assert (rec["account"], rec["qos"], rec["time_limit_min"]) == ("rl-lab", "normal", 9)
    backend.release(alloc.alloc_id)
