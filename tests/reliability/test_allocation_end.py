"""An allocation that ends while weaved is stopped (issue 33, defect 6): its node
daemons, stopped by Slurm, leave nothing of its jobs in the hosts' /dev/shm.

weaved stops (SIGTERM: its node daemons and members stay, for a restart to re-attach),
then the user ends the allocations with ``scancel --full``. Each node daemon gets its
SIGTERM while Slurm is ending the allocation (squeue: ``COMPLETING``), asks Slurm, and
removes every job's segments, its ``.lock`` and its registry (``weave node serve``)."""

from __future__ import annotations

import signal

from tests.harness.hosts import naming_jobs, node_names, node_shm, shm_paths
from tests.harness.processes import daemons_gone
from tests.harness.waits import settle, wait_for
from tests.reliability.test_slurm_faults import (
    Place,
    observe,
    place,  # noqa: F401 (the fixture)
    spawn,
    submit,
)
from weave_slurm.node.segments import SEG_SUFFIX
from weave_slurm.slurm.command_runner import run_command


def _left(p: Place) -> dict[str, list[str]]:
    """Every path under this instance's node roots, by node (none: nothing left)."""
    paths = {n: shm_paths(p.cluster, n, node_shm(p.instance, n)) for n in node_names(p.cluster)}
    return {n: q for n, q in paths.items() if q}


def test_scancel_while_weaved_is_stopped_leaves_no_segment(place: Place) -> None:  # noqa: F811
    p = place
    proc = spawn(p)
    try:
        job = submit(p, "ae", 81, steps=40)
        wait_for(lambda: observe(p, [job]), 180, f"job {job} at version >= 1",
                 until=lambda rows: int((rows[0]["iter"] or "0/0").split("/")[0]) >= 1)
        held = {n: naming_jobs(q, [job]) for n, q in _left(p).items()}
        assert any(q.endswith(SEG_SUFFIX) for qs in held.values() for q in qs), held
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    allocs = p.allocations()
    assert allocs, "weaved's stop released its allocations"
    for alloc_id in allocs:
        run_command(["scancel", "--full", alloc_id], env=p.env, timeout_s=30)
    left = settle(lambda: _left(p), 30, interval_s=1.0, until=lambda got: not got)
    assert left == {}, left
    assert daemons_gone(p.dirs.node_ckpt, 30)
