"""Periodic checkpoints (the timer's decisions and the daemon's tick) and request concurrency."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from weave_slurm.errors import ConfigError
from weave_slurm.node.autosave import AutosaveTimer
from weave_slurm.node.daemon import NodeDaemon
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op


def test_timer_fires_per_job_after_its_interval_and_restarts_on_mark() -> None:
    timer = AutosaveTimer(default_interval_s=600)
    timer.track("a", now_s=0.0)
    timer.track("b", now_s=100.0, interval_s=50.0)
    timer.track("off", now_s=0.0, interval_s=0.0)
    assert timer.due(149.0) == []
    assert timer.due(150.0) == ["b"]
    timer.mark("b", 150.0)
    assert timer.due(650.0) == ["b", "a"]       # b due since 200, a since 600
    timer.forget("a")
    assert timer.due(10_000.0) == ["b"]
    with pytest.raises(ConfigError, match="checkpoint_interval_s -1 must be a number >= 0"):
        AutosaveTimer(default_interval_s=-1)


def test_daemon_tick_checkpoints_changed_jobs_only(node: NodeDaemon) -> None:
    with NodeClient(node.config.socket) as c:
        job = c.register("j1", checkpoint_interval_s=60)
        c.register("j2")                          # the fixture's default: 0 = never
        t0 = time.monotonic()
        assert node.autosave_tick(t0 + 61) == {"j1": "empty"}
        c.put_state(job, "weights", {"w": torch.ones(4)}, version=1)
        assert node.autosave_tick(t0 + 100) == {}  # marked at t0 + 61: not due yet
        assert node.autosave_tick(t0 + 122) == {"j1": "saved"}
        assert node.autosave_tick(t0 + 183) == {"j1": "unchanged"}
        c.put_state(job, "weights", {"w": torch.zeros(4)}, version=2)
        assert node.autosave_tick(t0 + 244) == {"j1": "saved"}
        status = c.call(Op.STATUS)
    assert [node.ckpt.read(p).versions for p in node.ckpt.checkpoints(job)] == \
        [{"weights": 1}, {"weights": 2}]
    assert {j["job"]: j["checkpoint_interval_s"] for j in status["jobs"]} == \
        {"j1": 60.0, "j2": 0.0}
    assert '"checkpoint_interval_s": 60.0' in (node.config.root / "registry.json").read_text()


def test_a_long_checkpoint_blocks_neither_other_jobs_nor_status(node: NodeDaemon) -> None:
    with NodeClient(node.config.socket) as c:
        j1, j2 = c.register("j1"), c.register("j2")
        c.put_state(j1, "weights", {"w": torch.ones(4)}, version=1)
    outcome: dict[str, Any] = {}

    def checkpoint_j1() -> None:
        with NodeClient(node.config.socket) as slow:
            outcome["ckpt"] = slow.call(Op.CHECKPOINT, job="j1")

    lock = node.state_lock("j1")
    with lock:  # what a checkpoint of j1 holds for its whole (long) duration
        saver = threading.Thread(target=checkpoint_j1)
        saver.start()
        with NodeClient(node.config.socket, timeout_s=30) as c:
            c.put_state(j2, "weights", {"w": torch.ones(4)}, version=7)
            c.call(Op.CHECKPOINT, job="j2")
            status = c.call(Op.STATUS)
            started = c.call(Op.ACTIVATE, job="j1", phase="rollout", argv=["/bin/true"])
        assert saver.is_alive() and "ckpt" not in outcome   # j1's checkpoint still waits
    saver.join(30)
    assert {j["job"]: j["segments"].get("weights", {}).get("version")
            for j in status["jobs"]} == {"j1": 1, "j2": 7}
    assert started["phase"] == "rollout"
    assert outcome["ckpt"]["versions"] == {"weights": 1}
    assert len(node.ckpt.checkpoints(j1)) == len(node.ckpt.checkpoints(j2)) == 1
