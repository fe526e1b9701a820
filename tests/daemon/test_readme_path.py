"""README's path on the separate-hosts cluster, typed as a user types it (issue 30).

Nothing of the test's own: the exports come from ``weave cluster env`` (what ``weave
cluster up`` prints), weaved runs ``--backend slurm --site configs/site.example.toml``
as shipped, and the three shipped examples are submitted with ``weave-sbatch`` as
they are. Each runs at its declared layout (8 training ranks, 8 rollout engines on
CPU), weaved is killed with SIGKILL once every job has made progress, started again
with the same command, and every job completes. The command lines are the README's.
The run is the session's ``readme_run`` (tests/harness/readme_path.py), which
tests/daemon/test_hosts_acceptance.py checks too (each job's weights against its solo
run, what the hosts keep).
"""

from __future__ import annotations

import pytest

from tests.harness.readme_path import ReadmeRun

pytestmark = pytest.mark.slurm


def test_the_shipped_examples_complete_through_readmes_path_across_a_kill_9(
        readme_run: ReadmeRun) -> None:
    assert readme_run.exported == {"SLURM_CONF", "MUNGE_SOCKET"}, readme_run.exported
    for out in readme_run.submitted:
        assert out.startswith("Submitted weave job "), out
    rows = readme_run.final   # every job completed after the kill -9 and the restart
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    assert sorted(r["job"] for r in rows) == list(readme_run.ids)
    for job in readme_run.ids:     # at its declared layout: every rank and engine started
        layout = readme_run.shown[job]["layout"]
        assert layout["words"] == "train 1x8 ranks; rollout 1x8 engines x 1 GPU", layout
        assert layout["runs"] is None, layout
