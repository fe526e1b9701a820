"""The switches of a worker's job instances, against a scratch store in memory (CPU,
``device_switch = "on"``): the first switch-out puts a segment, the next ones write it
in place, a changed layout puts a new one, and a lost segment is a ``StateError``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest
import torch

from weave_slurm.device import instances
from weave_slurm.device.switch import module_tensors
from weave_slurm.errors import StateError

pytestmark = pytest.mark.torch

JOB = "inst"


class _Job:
    def __init__(self) -> None:
        torch.manual_seed(3)
        self.model = torch.nn.Linear(8, 8)

    def device_tensors(self) -> dict[str, torch.Tensor]:
        return module_tensors(self.model, "m")


@dataclass(frozen=True)
class _Context:
    device: str = "cpu"


@dataclass(frozen=True)
class _Instance:
    job: _Job
    context: _Context = _Context()


@dataclass(frozen=True)
class _Segment:
    tensors: dict[str, torch.Tensor]
    storage: torch.UntypedStorage


class _Scratch:
    """One flat storage per role, as a put writes it."""

    def __init__(self) -> None:
        self.segments: dict[str, _Segment] = {}
        self.puts = 0

    def name(self, role: str) -> str:
        return f"device.{role}"

    def get(self, role: str) -> _Segment | None:
        return self.segments.get(role)

    def put(self, role: str, tensors: Mapping[str, torch.Tensor]) -> None:
        flat = torch.cat([t.detach().reshape(-1) for t in tensors.values()])
        views, lo = {}, 0
        for k, t in tensors.items():
            views[k] = flat[lo:lo + t.numel()].view(t.shape)
            lo += t.numel()
        self.segments[role] = _Segment(views, flat.untyped_storage())
        self.puts += 1


@pytest.fixture
def instance() -> Iterator[_Instance]:
    inst = _Instance(_Job())
    instances.track(JOB, "train", inst, "on")
    yield inst
    instances.forget(JOB, "train")


def _weights(inst: _Instance) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in inst.job.device_tensors().items()}


def test_a_switch_out_frees_the_tensors_and_a_switch_in_restores_them(
        instance: _Instance) -> None:
    before, scratch = _weights(instance), _Scratch()
    held = instances.held_bytes(JOB)
    assert held == sum(t.numel() * t.element_size() for t in before.values()) > 0
    out = instances.switch_out(JOB, scratch)
    assert out["device_held_bytes"] == 0 and instances.held_bytes(JOB) == 0
    assert [s["segment"] for s in out["switches"]] == ["device.train"]
    assert scratch.puts == 1 and instance.job.model.weight.numel() == 0
    back = instances.switch_in(JOB, "train", scratch)
    assert back is not None and back["moved_bytes"] == held
    assert all(torch.equal(before[k], v) for k, v in _weights(instance).items())
    assert instances.switch_in(JOB, "train", scratch) is None    # nothing is out


def test_the_next_switch_out_writes_the_segment_in_place(instance: _Instance) -> None:
    scratch = _Scratch()
    instances.switch_out(JOB, scratch)
    instances.switch_in(JOB, "train", scratch)
    with torch.no_grad():
        instance.job.model.weight.add_(1.0)
    after = _weights(instance)
    instances.switch_out(JOB, scratch)
    assert scratch.puts == 1                         # the same layout: no new put
    instances.switch_in(JOB, "train", scratch)
    assert all(torch.equal(after[k], v) for k, v in _weights(instance).items())


def test_a_changed_layout_puts_a_new_segment(instance: _Instance) -> None:
    scratch = _Scratch()
    instances.switch_out(JOB, scratch)
    instances.switch_in(JOB, "train", scratch)
    instance.job.model.weight.grad = torch.zeros_like(instance.job.model.weight)
    instances.switch_out(JOB, scratch)
    assert scratch.puts == 2


def test_a_lost_scratch_segment_is_a_state_error(instance: _Instance) -> None:
    scratch = _Scratch()
    instances.switch_out(JOB, scratch)
    scratch.segments.clear()
    with pytest.raises(StateError, match=r"job inst: its switched-out train state "
                                         r"\(segment 'device.train'\) is gone"):
        instances.switch_in(JOB, "train", scratch)


def test_an_instance_that_is_replaced_gets_a_new_switch(instance: _Instance) -> None:
    first = instances.track(JOB, "train", instance, "on")
    assert instances.track(JOB, "train", instance, "on") is first
    assert instances.track(JOB, "train", _Instance(_Job()), "on") is not first
