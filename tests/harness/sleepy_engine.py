"""A fake inference engine that honours vLLM's sleep/wake contract, on the CPU.

vLLM (``LLM(enable_sleep_mode=True)``) frees an engine's GPU memory with
``sleep(level)``: level 1 offloads the weights to host memory and discards the KV
cache; level 2 discards both. ``wake_up(tags)`` gives back the memory of the named
kinds (``"weights"``, ``"kv_cache"``; none named: all); after a level-2 sleep the
woken weights hold garbage until the weights are loaded again. Generating while any
of it sleeps is an error. :class:`SleepyEngine` keeps that state machine over the
parameters of the reference GRPO job's policy (each freed by swapping its ``.data``
for an empty tensor; woken garbage is NaN, so a contract breach shows in the
results), and is the job's rollout role (``OffloadsDevice``: ``sleep(level)`` out,
``wake_up`` + ``load_weights`` from the node's ``weights`` segment in). Its training
role offloads by its own means too: the policy, reference and Adam moments copied to
private host memory, as DeepSpeed's ``offload_states`` does (those bytes are what the
node's budget charges while it is out).

Entry point ``tests.harness.sleepy_engine:job``; option ``sleep_level`` (1 or 2,
default 2), the rest are the reference job's options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext, Role, Trajectories
from weave_slurm.workloads.grpo_toy import GrpoToyJob

TAGS = ("weights", "kv_cache")
KV_CACHE_BYTES = 1 << 20


class SleepyEngine:
    """The sleep/wake state machine over one module's parameters and a KV cache."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.asleep: set[str] = set()
        self.level = 0
        self.loaded = True
        self.kv_cache: torch.Tensor | None = torch.zeros(KV_CACHE_BYTES, dtype=torch.uint8)
        self._host: dict[str, torch.Tensor] = {}
        self.sleeps = 0

    def _params(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_parameters())

    def sleep(self, level: int) -> int:
        """Free the memory; returns the host bytes it keeps (level 1: the weights)."""
        if level not in (1, 2):
            raise ConfigError(f"sleep level {level!r} (valid: 1, 2)")
        if self.asleep:
            raise StateError(f"engine already sleeps ({sorted(self.asleep)})")
        params = self._params()
        self._host = {k: p.detach().clone() for k, p in params.items()} if level == 1 else {}
        for p in params.values():
            p.data = torch.empty(0, dtype=p.dtype)
        self.kv_cache = None
        self.asleep, self.level = set(TAGS), level
        self.sleeps += 1
        return sum(t.numel() * t.element_size() for t in self._host.values())

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        for tag in tags or TAGS:
            if tag not in TAGS:
                raise ConfigError(f"wake_up tag {tag!r} (valid: {', '.join(TAGS)})")
            if tag not in self.asleep:
                continue
            if tag == "weights":
                for name, p in self._params().items():
                    shape = self._shapes[name]
                    p.data = (self._host[name] if self.level == 1
                              else torch.full(shape, float("nan"), dtype=p.dtype))
                self.loaded = self.level == 1
                self._host = {}
            else:
                self.kv_cache = torch.zeros(KV_CACHE_BYTES, dtype=torch.uint8)
            self.asleep.discard(tag)

    def remember_shapes(self) -> None:
        self._shapes = {k: p.shape for k, p in self._params().items()}

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if "weights" in self.asleep:
            raise StateError("load_weights while the weights sleep: wake_up(['weights']) first")
        with torch.no_grad():
            for name, p in self._params().items():
                p.copy_(tensors[name])
        self.loaded = True

    def check_awake(self) -> None:
        if self.asleep:
            raise StateError(f"generate while the engine sleeps ({sorted(self.asleep)})")
        if not self.loaded:
            raise StateError("generate after a level-2 sleep without load_weights")


class SleepyJob:
    """The reference GRPO job with a sleeping engine (see the module doc)."""

    def __init__(self) -> None:
        self.inner = GrpoToyJob()
        self.level = 2
        self.engine: SleepyEngine | None = None
        self._host: list[tuple[torch.Tensor, torch.Tensor]] = []

    def setup(self, ctx: JobContext) -> None:
        options = dict(ctx.options)
        self.level = int(options.pop("sleep_level", 2))
        self.inner.setup(dataclasses.replace(ctx, options=options))
        if ctx.role is Role.ROLLOUT:
            self.engine = SleepyEngine(self.inner.policy)
            self.engine.remember_shapes()

    def generate(self, weights_version: int) -> Trajectories:
        if self.engine is not None:
            self.engine.check_awake()
        return self.inner.generate(weights_version)

    def update(self, trajectories: Trajectories) -> Mapping[str, float]:
        return self.inner.update(trajectories)

    def merge_trajectories(self, parts: Sequence[Trajectories]) -> Trajectories:
        return self.inner.merge_trajectories(parts)

    def export_weights(self) -> dict[str, torch.Tensor]:
        return self.inner.export_weights()

    def import_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if self.engine is not None:
            self.engine.load_weights(tensors)
        else:
            self.inner.import_weights(tensors)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.inner.state_tensors()

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.inner.load_state(tensors)

    # -- OffloadsDevice --------------------------------------------------------------
    def offload_device(self) -> int:
        if self.engine is not None:
            return self.engine.sleep(self.level)
        self._host = [(t, t.detach().clone()) for t in self.inner.device_tensors().values()]
        for t, _ in self._host:
            t.data = torch.empty(0, dtype=t.dtype)
        return sum(h.numel() * h.element_size() for _, h in self._host)

    def reload_device(self, weights: Mapping[str, torch.Tensor] | None) -> None:
        if self.engine is not None:
            self.engine.wake_up(["weights"])
            if self.level == 2:
                if weights is None:
                    raise StateError("a level-2 wake needs the weights to load")
                self.engine.load_weights({k.removeprefix("policy."): v
                                          for k, v in weights.items()})
            self.engine.wake_up(["kv_cache"])
            return
        for t, host in self._host:
            t.data = host
        self._host = []


def job() -> SleepyJob:
    return SleepyJob()
