"""A pooled member: its rollout spread over the group's pool GPUs (pure, no I/O).

A pooled group (docs/placement.md "Pooled rollout") holds GPUs of the rollout pool
rather than whole nodes, and runs each member's rollout, in turn order, as
``E = W / T`` engines over all of them (``W``: the pool's GPUs, ``T``: the member's
GPUs per engine, from its stored layout). ``MemberSpec.pool`` gives the pool's GPUs on
each of the member's pins, in pin order; :func:`pool_layout` is the member's rollout
layout derived from it (``g // T`` engines on a pin holding ``g`` GPUs). Its training
layout stays the stored one. The width may change at a turn boundary
(``Relayout.repin`` with a new pool); the engines follow.

Only a job whose batch does not depend on its engine count is pooled
(:func:`~weave_slurm.workloads.builtins.not_poolable`): its weights then stay
bit-identical to its solo run whatever the width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import RolloutLayout
from weave_slurm.workloads.builtins import not_poolable


class Pooled(Protocol):
    """What :func:`validate_pooled` reads of a member's spec (``MemberSpec``)."""

    @property
    def pool(self) -> tuple[int, ...] | None: ...
    @property
    def rollout_pins(self) -> tuple[int, ...]: ...
    @property
    def colocated(self) -> bool: ...
    @property
    def engine_gpus(self) -> int: ...
    @property
    def entry_point(self) -> str: ...
    @property
    def options(self) -> Mapping[str, Any]: ...
    @property
    def launch(self) -> object | None: ...


def pool_layout(where: str, pool: Sequence[int], engine_gpus: int) -> RolloutLayout:
    """``pool[i] // engine_gpus`` engines on the ``i``-th pin; ConfigError (naming
    ``where`` and the valid choices) for a pin with fewer than ``engine_gpus`` GPUs or
    GPUs that are not a multiple of it (an engine never spans two nodes, and a GPU
    left over would be held and idle)."""
    t = engine_gpus
    bad = [g for g in pool if isinstance(g, bool) or not isinstance(g, int) or g < t
           or g % t]
    if not pool or bad:
        raise ConfigError(f"{where}: pool={list(pool)!r} with {t} GPU(s) per engine; valid: "
                          f"one entry per pin, each a multiple of {t} GPU(s) "
                          f"({', '.join(str(t * k) for k in range(1, 4))}, ...)")
    return RolloutLayout(t, tuple(g // t for g in pool))


def validate_pooled(spec: Pooled, where: str) -> None:
    """A pooled ``spec`` (``spec.pool`` set): not co-located, one pool entry per pin,
    engines that fit (:func:`pool_layout`), a job whose batch is width-free."""
    assert spec.pool is not None
    if spec.colocated:
        raise ConfigError(f"{where}: pool={list(spec.pool)!r} but co-located (its rollout "
                          "runs on its training node); valid: pool=None, or colocated=false")
    if len(spec.pool) != len(spec.rollout_pins):
        raise ConfigError(f"{where}: pool={list(spec.pool)!r} names {len(spec.pool)} pin(s) "
                          f"but rollout_pins={list(spec.rollout_pins)!r} has "
                          f"{len(spec.rollout_pins)}; valid: one entry per pin, in pin order")
    pool_layout(where, spec.pool, spec.engine_gpus)
    why = not_poolable(spec.entry_point, spec.options, spec.launch is not None)
    if why is not None:
        raise ConfigError(f"{where}: not poolable: {why}; valid: pool=None (its rollout "
                          "on its own pins, as its layout places it)")
