"""Every command block of README.md runs as written (issue 30: the documented path is
the tested path).

One bash session per section of the page, in order, from a directory that is the
repository root to the commands (tests/docs/sessions.py): the local-backend session
runs weaved and a `#WEAVE` script job; the cluster session brings up its own cluster of
separate hosts with ``weave cluster up --hosts separate`` (about a second; the session
cluster cannot be used: the block ends with ``weave cluster down``), runs weaved with
the shipped example site and submits shipped job files; the planning session checks,
plans and simulates the shipped configs. A block whose command fails, or that a page
marks as skipped (``<!--pytest.mark.skip(reason=...)-->``, with its reason), is its
own test id.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.docs.blocks import DocBlock, doc_blocks
from tests.docs.sessions import Sessions, run_block, sessions, user_env
from weave_slurm.slurm.cluster import LocalCluster

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
