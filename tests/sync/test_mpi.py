"""The MPI path (mpi4py under mpirun): same protocol, same guarantees."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from weave_slurm.sync.group_launch import run_group
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.linkemu import LinkSpec
from weave_slurm.sync.scenario import Backend, Scenario

pytestmark = [pytest.mark.mpi, pytest.mark.torch]

VersionsFactory = Callable[[int, list[float]], tuple[str, ...]]
MIB = 1 << 20


def test_mpi_delta_sync_is_bit_exact_and_refuses_duplicates(
        make_versions: VersionsFactory) -> None:
    files = make_versions(2 * MIB, [0.01])
    sc = Scenario("job-mpi", n_train=2, n_rollout=2, total_nbytes=2 * MIB,
                  version_files=(files[0], files[1], files[1]), versions=(1, 2, 2),
                  mode=SyncMode.DELTA, backend=Backend.MPI)
    outcomes = run_group(sc, LinkSpec(rate_mbit=None))
    for o in outcomes:
        assert o.result is not None, o.stderr
        assert [s["ok"] for s in o.result["steps"]] == [True, True, False]
        assert o.result["steps"][2]["error"] == "VersionMismatch"
        if o.result["pool"] == "rollout":
            assert all(s["identical"] for s in o.result["steps"][:2])
        else:
            assert o.result["steps"][1]["delta_pieces"] == 1
