"""Host-memory accounting: refusals name the budget and say what to do."""

from __future__ import annotations

import pytest

from weave_slurm.errors import ConfigError, InfeasibleRequest, InsufficientResources
from weave_slurm.node.budget import GIB, MemoryBudget
from weave_slurm.node.index import JobRef

A, B = JobRef("a", 0), JobRef("b", 1000)


def test_charges_add_up_and_report_used_and_free() -> None:
    budget = MemoryBudget(host_mem_gib=1.0)
    budget.charge(A, "weights", GIB // 4)
    budget.charge(B, "weights", GIB // 4)
    budget.charge(A, "optim", GIB // 8)
    report = budget.report()
    assert report.used_bytes == GIB // 4 * 2 + GIB // 8
    assert report.free_bytes == GIB - report.used_bytes
    assert report.per_job_bytes == {"a": GIB // 4 + GIB // 8, "b": GIB // 4}


def test_state_larger_than_the_node_is_infeasible() -> None:
    budget = MemoryBudget(host_mem_gib=1.0)
    with pytest.raises(InfeasibleRequest, match=r"host_mem_gib=1\.000"):
        budget.charge(A, "weights", GIB + 1)


def test_state_beyond_what_is_free_is_refused_until_released() -> None:
    budget = MemoryBudget(host_mem_gib=1.0)
    budget.charge(A, "weights", GIB * 3 // 4)
    with pytest.raises(InsufficientResources, match=r"only 0\.250 GiB .* is free"):
        budget.charge(B, "weights", GIB // 2)
    assert budget.report().used_bytes == GIB * 3 // 4  # the refusal charged nothing
    budget.release_job(A)
    budget.charge(B, "weights", GIB // 2)
    assert budget.report().per_job_bytes == {"b": GIB // 2}


def test_replacing_a_segment_charges_only_the_difference() -> None:
    budget = MemoryBudget(host_mem_gib=1.0)
    budget.charge(A, "weights", GIB * 3 // 4)
    budget.charge(A, "weights", GIB)  # grows in place: allowed, it is the same segment
    assert budget.used_bytes == GIB


def test_bad_budget_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="host_mem_gib"):
        MemoryBudget(host_mem_gib=0)
