"""The warm switch of one job instance on the CPU (``SwitchMode.ON``): every byte comes
back bit for bit, the tensors' memory is really released while it is out, and the
objects (parameters, optimizer state) stay the same."""

from __future__ import annotations

import ctypes
import gc

import pytest
import torch

from weave_slurm.device.hostmem import Copier, HostRegistry, fill_host
from weave_slurm.device.switch import (
    DeviceSwitch,
    SwitchMode,
    module_tensors,
    optimizer_tensors,
)
from weave_slurm.errors import ConfigError, StateError

pytestmark = pytest.mark.torch


class _Job:
    """A model with Adam state after one step (and a tied weight)."""

    def __init__(self, width: int = 256) -> None:
        torch.manual_seed(0)
        self.width = width
        self.model = torch.nn.Sequential(torch.nn.Linear(width, width),
                                         torch.nn.Linear(width, width))
        self.model.register_buffer("scale", torch.ones(width))
        self.model[1].weight = self.model[0].weight            # tied
        self.optim = torch.optim.Adam(self.model.parameters())
        self.step()

    def step(self) -> torch.Tensor:
        x = torch.ones(4, self.width)
        loss: torch.Tensor = (self.model(x) * self.model.get_buffer("scale")).square().mean()
        self.optim.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optim.step()
        return loss.detach()

    def device_tensors(self) -> dict[str, torch.Tensor]:
        return {**module_tensors(self.model, "m"), **optimizer_tensors(self.optim, "o")}


def _views(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.empty_like(v) for k, v in tensors.items()}


def _rss_bytes() -> int:
    """Resident bytes after glibc gave its free heap back (freed blocks of a size it
    once mapped stay in its heap otherwise, and RSS would not show the release)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_switch_out_and_in_restores_every_byte_and_keeps_the_objects() -> None:
    job = _Job()
    sw = DeviceSwitch(job, "cpu", SwitchMode.ON)
    tensors = sw.tensors()
    assert "m.1.weight" not in tensors and "m.0.weight.grad" in tensors   # tied: once
    assert {"o.0.exp_avg", "o.0.exp_avg_sq", "m.buf.scale"} <= set(tensors)
    before = {k: v.clone() for k, v in tensors.items()}
    ids = {k: id(v) for k, v in tensors.items()}
    views = _views(tensors)
    out = sw.out(tensors, views, None)
    assert out.moved_bytes == sum(v.numel() * v.element_size() for v in before.values())
    assert sw.switched_out and sw.held_bytes() == 0
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors.values())
    back = sw.into(views, None)
    assert back.moved_bytes == out.moved_bytes and not sw.switched_out
    now = sw.tensors()
    assert {k: id(v) for k, v in now.items()} == ids
    assert [k for k, v in before.items() if not torch.equal(now[k], v)] == []
    assert job.model[1].weight is job.model[0].weight


def test_training_goes_on_identically_after_switches() -> None:
    plain, switched = _Job(), _Job()
    sw = DeviceSwitch(switched, "cpu", SwitchMode.ON)
    for _ in range(3):
        tensors = sw.tensors()
        views = _views(tensors)
        sw.out(tensors, views, None)
        sw.into(views, None)
        assert torch.equal(plain.step(), switched.step())
    for a, b in zip(plain.model.parameters(), switched.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_memory_of_switched_out_tensors_is_given_back() -> None:
    job = _Job(width=2048)            # ~16 MiB a matrix: weights, grads, two moments
    sw = DeviceSwitch(job, "cpu", SwitchMode.ON)
    tensors = sw.tensors()
    nbytes = sum(v.numel() * v.element_size() for v in tensors.values())
    host = torch.empty(nbytes, dtype=torch.uint8)   # the "segment", touched before
    host.fill_(0)
    views, off = {}, 0
    for k, v in tensors.items():
        n = v.numel() * v.element_size()
        views[k] = host[off:off + n].view(v.dtype).view(v.shape)
        off += n
    gc.collect()
    rss = _rss_bytes()
    sw.out(tensors, views, None)
    del tensors
    gc.collect()
    freed = rss - _rss_bytes()
    assert freed > 0.8 * nbytes, (freed, nbytes)
    sw.into(views, None)
    assert _rss_bytes() - (rss - freed) > 0.8 * nbytes


def test_tensors_that_cannot_be_switched_are_refused_in_words() -> None:
    class Shared:
        def __init__(self) -> None:
            self.base = torch.zeros(8)

        def device_tensors(self) -> dict[str, torch.Tensor]:
            return {"a": self.base[:4], "b": self.base[4:]}

    with pytest.raises(StateError, match="share one storage"):
        DeviceSwitch(Shared(), "cpu", SwitchMode.ON).tensors()

    class Strided:
        def device_tensors(self) -> dict[str, torch.Tensor]:
            return {"t": torch.zeros(4, 4).t()}

    with pytest.raises(StateError, match="not contiguous"):
        DeviceSwitch(Strided(), "cpu", SwitchMode.ON).tensors()


def test_modes_and_jobs_without_device_tensors() -> None:
    assert SwitchMode.parse("auto") is SwitchMode.AUTO
    with pytest.raises(ConfigError, match=r"device_switch: unknown value 'gpu'.*auto"):
        SwitchMode.parse("gpu")
    assert not SwitchMode.AUTO.applies("cpu") and SwitchMode.AUTO.applies("cuda:1")
    assert SwitchMode.ON.applies("cpu") and not SwitchMode.OFF.applies("cuda:0")
    job = _Job()
    assert not DeviceSwitch(job, "cpu", SwitchMode.AUTO).active
    assert DeviceSwitch(job, "cpu", SwitchMode.AUTO).held_bytes() == 0
    assert not DeviceSwitch(object(), "cpu", SwitchMode.ON).active


def test_host_memory_helpers_on_the_cpu() -> None:
    reg = HostRegistry()
    storage = torch.zeros(16).untyped_storage()
    assert reg.register(storage) is False and reg.registered_bytes == 0   # no CUDA here
    src = {"a": torch.arange(4.0), "b": torch.ones(2, 2, dtype=torch.float64)}
    dst = {k: torch.empty_like(v) for k, v in src.items()}
    fill_host(storage, ((src[k], dst[k]) for k in src))
    assert all(torch.equal(src[k], dst[k]) for k in src)
    out = {k: torch.empty_like(v) for k, v in src.items()}
    assert Copier("cpu").copy(((src[k], out[k]) for k in src), pinned=False) == 48
    assert all(torch.equal(src[k], out[k]) for k in src)


def test_a_second_switch_out_is_refused_and_loses_nothing() -> None:
    job = _Job()
    sw = DeviceSwitch(job, "cpu", SwitchMode.ON)
    tensors = sw.tensors()
    before = {k: v.clone() for k, v in tensors.items()}
    views = _views(tensors)
    sw.out(tensors, views, None)
    with pytest.raises(StateError, match="already switched out"):
        sw.out(sw.tensors(), views, None)
    sw.into(views, None)
    assert all(torch.equal(sw.tensors()[k], v) for k, v in before.items())
