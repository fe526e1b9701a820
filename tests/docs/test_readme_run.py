"""Every command block of README.md runs as written (issue 30: the documented path is
the tested path).

One bash session per section of the page, its blocks in order, from a directory that
is the repository root to the commands (tests/docs/sessions.py); each block is a test
id. The local-backend session runs weaved and submits a `#WEAVE` script. The cluster
session brings up a cluster of separate hosts of its own with ``weave cluster up
--hosts separate`` (under a second; not the session's cluster, which its last block's
``weave cluster down`` would end), exports what that prints, runs weaved with the
shipped example site, waits for a script job to COMPLETE (the page's expected output)
and submits a shipped job spec. The planning session checks, plans and simulates the
shipped configs. A block the page marks as skipped (``<!--pytest.mark.skip(reason=
...)-->``) is reported with its reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.docs.blocks import DocBlock, doc_blocks
from tests.docs.sessions import Sessions, run_block, sessions, user_env
from weave_slurm.slurm.local_cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.torch, pytest.mark.slow]


#: No block of the page takes longer on the CI machine (job 1 ends in 15-60 s).
BLOCK_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    with sessions(tmp_path_factory, "readme", user_env()) as s:
        try:
            yield s
        finally:   # a session that failed before its 'weave cluster down'
            for state in s.base.glob("repo*/.state/cluster"):
                LocalCluster(state).down()


@pytest.mark.parametrize("block", doc_blocks("README.md", {"bash", "sh"}))
def test_readme_block(readme: Sessions, block: DocBlock) -> None:
    run_block(readme, block, BLOCK_TIMEOUT_S)
