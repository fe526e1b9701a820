"""Node-local segment ops weaved uses across hosts: a checked copy, and a digest."""

from __future__ import annotations

import pytest
import torch

from weave_slurm.errors import ConfigError, InsufficientResources, StateError
from weave_slurm.node.crc import CRC_KEY
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op
from weave_slurm.node.segments import weights_digest

pytestmark = pytest.mark.torch


def test_copy_writes_a_checked_buffer_on_the_node(node: NodeDaemon) -> None:
    w = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(2)}
    with NodeClient(node.config.socket) as c:
        job = c.register("j1")
        c.put_state(job, "weights", w, version=4, extra={"step": 4})
        reply = c.call(Op.COPY, job="j1", name="weights", as_name="weights.b1")
        got = c.attach(job)["weights.b1"]
        assert reply["version"] == 4 and got.index.version == 4
        assert got.index.extra["step"] == 4 and got.index.extra[CRC_KEY] == reply["crc32"]
        assert all(torch.equal(got.tensors[k], w[k]) for k in w)
        status = c.call(Op.STATUS)
        assert status["memory"]["per_job_bytes"]["j1"] == 2 * got.index.size_bytes
        with pytest.raises(StateError, match="has no segment 'nope'"):
            c.call(Op.COPY, job="j1", name="nope", as_name="x")
        with pytest.raises(ConfigError, match="as_name must differ"):
            c.call(Op.COPY, job="j1", name="weights", as_name="weights")


def test_copy_beyond_the_budget_is_refused_and_charges_nothing(node: NodeDaemon) -> None:
    big = {"w": torch.zeros((node.budget.limit_bytes // 4) * 6 // 10, dtype=torch.float32)}
    with NodeClient(node.config.socket) as c:
        job = c.register("j2")
        c.put_state(job, "weights", big, version=1)
        before = c.call(Op.STATUS)["memory"]["used_bytes"]
        with pytest.raises(InsufficientResources):
            c.call(Op.COPY, job="j2", name="weights", as_name="weights.b0")
        assert c.call(Op.STATUS)["memory"]["used_bytes"] == before
        assert "weights.b0" not in c.attach(job)


def test_digest_is_the_sha256_of_the_tensors(node: NodeDaemon) -> None:
    w = {"w": torch.randn(5, 3), "b": torch.zeros(3, dtype=torch.float16)}
    with NodeClient(node.config.socket) as c:
        job = c.register("j3")
        c.put_state(job, "weights", w, version=2)
        reply = c.call(Op.DIGEST, job="j3", name="weights")
    assert reply == {"name": "weights", "version": 2, "sha256": weights_digest(w)}
    w["w"][0, 0] += 1
    assert reply["sha256"] != weights_digest(w)
