"""NodeLink: a remote node daemon that did not answer is left alone for a while, so a
host cut off the network costs one timeout, not one per request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from weave_slurm.errors import NodeGone
from weave_slurm.node.protocol import Op
from weave_slurm.runtime.faults import Fault, FaultKind
from weave_slurm.runtime.group import NodeRef
from weave_slurm.runtime.nodes import RETRY_AFTER_S, NodeLink
from weave_slurm.vocab import Phase, Pool


class FakeClient:
    """Answers STATUS, or fails like a daemon whose host is unreachable."""

    def __init__(self, log: list[str], fail: list[bool]) -> None:
        self.log, self.fail = log, fail

    def call(self, op: Op, **args: Any) -> dict[str, Any]:
        self.log.append(op.value)
        if self.fail[0]:
            raise NodeGone("timed out")
        return {"ok": True}

    def close(self) -> None:
        pass


class FakeLink(NodeLink):
    """A NodeLink whose every node daemon is one fake client."""

    def __init__(self, client: FakeClient, now: Any) -> None:
        super().__init__(now=now)
        self.fake = client

    def client(self, node: NodeRef) -> Any:
        return self.fake


def _link(remote: bool) -> tuple[NodeLink, NodeRef, list[str], list[bool], list[float]]:
    log: list[str] = []
    fail = [True]
    clock = [100.0]
    link = FakeLink(FakeClient(log, fail), now=lambda: clock[0])
    node = NodeRef("n1", Pool.TRAIN, Path("/nonexistent/n1.sock"),
                   address="10.0.0.1" if remote else None, port=1 if remote else None)
    return link, node, log, fail, clock


def test_unanswered_remote_node_fails_at_once_until_retry() -> None:
    link, node, log, fail, clock = _link(remote=True)
    with pytest.raises(NodeGone, match="timed out"):
        link.call(node, Op.STATUS)
    assert len(log) == 1
    for _ in range(5):                                   # left alone: nothing sent
        with pytest.raises(NodeGone, match="unreachable"):
            link.call(node, Op.STATUS)
    assert len(log) == 1
    clock[0] += RETRY_AFTER_S + 0.1                      # asked again after the wait
    fail[0] = False
    assert link.call(node, Op.STATUS) == {"ok": True}
    assert len(log) == 2
    fail[0] = True                                       # an answer cleared the mark
    with pytest.raises(NodeGone, match="timed out"):
        link.call(node, Op.STATUS)
    assert len(log) == 3


def test_local_node_is_always_asked() -> None:
    link, node, log, _fail, _clock = _link(remote=False)
    for _ in range(3):
        with pytest.raises(NodeGone):
            link.call(node, Op.STATUS)
    assert len(log) == 3


def test_the_fault_names_the_node_that_did_not_answer() -> None:
    """A request made for a run on one node (a sync from the training node) that finds
    another node's daemon gone (the rollout node) names the gone one."""
    link, node, _log, _fail, _clock = _link(remote=True)
    for words in ("timed out", "unreachable"):   # the first failure, then the cached one
        with pytest.raises(NodeGone, match=words) as err:
            link.call(node, Op.STATUS)
        assert err.value.node == "n1"
        fault = Fault.from_error(err.value, "t0", Phase.TRAIN)
        assert fault.kind is FaultKind.NODE_GONE and fault.node == "n1"
        assert fault.words().startswith("node daemon on node n1 stopped answering")


def test_a_node_weaved_starts_is_waited_for_not_started_by_hand(tmp_path: Path) -> None:
    """A daemon of weaved's own node-daemon step (``NodeRef.step_log``) that does not
    answer: the fault's words point at that step's log, not at 'weave node serve'."""
    log = tmp_path / "node-1-h20-0.log"
    node = NodeRef("n1", Pool.ROLLOUT, tmp_path / "node-n1.sock", step_log=log)
    with pytest.raises(NodeGone) as caught:
        NodeLink().call(node, Op.STATUS)
    words = Fault.from_error(caught.value).words()
    assert "weave node serve" not in words and f"see its log {log}" in words, words
