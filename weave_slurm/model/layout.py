"""A member's layout: how its roles spread over GPUs and nodes (pure, no torch).

- **Training** is ``N`` ranks of one torch.distributed world, one rank per GPU
  (``[gpus] train = N``), over the fewest training nodes that hold them
  (``ceil(N / gpus_per_node)``), spread as evenly as possible: the first nodes take one
  rank more (12 GPUs on 8-GPU nodes: 6 + 6; 9: 5 + 4).
- **Rollout** is ``E = R / T`` engines of ``T`` GPUs each (tensor parallel; ``[gpus]
  rollout = R``, ``[gpus] engine = T``: vLLM's ``tensor_parallel_size``), an engine never
  split over two nodes, over the fewest rollout nodes that hold them (the same count as
  ``ceil(R / gpus_per_node)``, or ``T`` is refused), spread as evenly as possible.

One layout is computed per job at submission (:func:`member_layout`, from the spec and
the site's ``gpus_per_node`` per pool) and stored in its profile: the model's node
counts and state per node, placement's node counts and the runtime's member nodes all
read it. Node ``i`` of a role is the ``i``-th node the member uses in that role (the
runtime maps it to the group's allocation nodes: its training nodes are the first
training nodes of the group, its rollout nodes its pins in order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import weave_slurm.model.perf as perf
from weave_slurm.config.job import JobSpec, options_dict
from weave_slurm.config.site import SiteConfig
from weave_slurm.errors import ConfigError, InfeasibleRequest


def nodes_for(gpus: int, gpus_per_node: int) -> int:
    """``ceil(gpus / gpus_per_node)``, in integers (no float rounding for huge counts)."""
    return -(-gpus // gpus_per_node)


def spread(items: int, nodes: int) -> tuple[int, ...]:
    """``items`` over ``nodes`` as evenly as possible, the first nodes one more."""
    base, extra = divmod(items, nodes)
    return tuple(base + (1 if i < extra else 0) for i in range(nodes))


@dataclass(frozen=True, slots=True)
class TrainLayout:
    """The training gang: ``ranks_per_node[i]`` ranks (one per GPU) on training node ``i``."""

    ranks_per_node: tuple[int, ...]

    @property
    def nodes(self) -> int:
        return len(self.ranks_per_node)

    @property
    def ranks(self) -> int:
        return sum(self.ranks_per_node)

    def ranks_on(self, node: int) -> range:
        """The global ranks on training node ``node`` (local rank = position in it)."""
        first = sum(self.ranks_per_node[:node])
        return range(first, first + self.ranks_per_node[node])

    def place(self, rank: int) -> tuple[int, int]:
        """``(training node index, local rank)`` of global ``rank``; the local rank is
        its GPU on that node (``LOCAL_RANK``)."""
        node = _node_of(rank, self.ranks_per_node, "rank")
        return node, rank - self.ranks_on(node).start

    def words(self) -> str:
        return f"{_times(self.ranks_per_node)} rank{'s' if self.ranks > 1 else ''}"


@dataclass(frozen=True, slots=True)
class RolloutLayout:
    """The rollout: ``engines_per_node[i]`` engines of ``engine_gpus`` GPUs on rollout
    node ``i`` (the member's ``i``-th pin)."""

    engine_gpus: int
    engines_per_node: tuple[int, ...]

    @property
    def nodes(self) -> int:
        return len(self.engines_per_node)

    @property
    def engines(self) -> int:
        return sum(self.engines_per_node)

    @property
    def gpus(self) -> int:
        return self.engines * self.engine_gpus

    def engines_on(self, node: int) -> range:
        """The engine ranks on rollout node ``node``."""
        first = sum(self.engines_per_node[:node])
        return range(first, first + self.engines_per_node[node])

    def place(self, engine: int) -> tuple[int, range]:
        """``(rollout node index, its GPUs on that node)`` of ``engine``: the engines of a
        node hold consecutive GPUs, ``engine_gpus`` each."""
        node = _node_of(engine, self.engines_per_node, "engine")
        first = (engine - self.engines_on(node).start) * self.engine_gpus
        return node, range(first, first + self.engine_gpus)

    def words(self) -> str:
        return (f"{_times(self.engines_per_node)} engine{'s' if self.engines > 1 else ''}"
                f" x {self.engine_gpus} GPU{'s' if self.engine_gpus > 1 else ''}")


@dataclass(frozen=True, slots=True)
class MemberLayout:
    """A member's training gang and rollout engines."""

    train: TrainLayout
    rollout: RolloutLayout

    def words(self) -> str:
        """One line, e.g. ``train 2x8 ranks; rollout 1x2 engines x 4 GPUs``."""
        return f"train {self.train.words()}; rollout {self.rollout.words()}"

    def to_json(self) -> dict[str, Any]:
        return {"train": {"ranks_per_node": list(self.train.ranks_per_node)},
                "rollout": {"engine_gpus": self.rollout.engine_gpus,
                            "engines_per_node": list(self.rollout.engines_per_node)}}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> MemberLayout:
        t, r = raw["train"], raw["rollout"]
        return cls(TrainLayout(tuple(int(x) for x in t["ranks_per_node"])),
                   RolloutLayout(int(r["engine_gpus"]),
                                 tuple(int(x) for x in r["engines_per_node"])))


def _node_of(index: int, per_node: tuple[int, ...], what: str) -> int:
    """The node holding item ``index`` of a role spread ``per_node``."""
    total = 0
    for node, count in enumerate(per_node):
        total += count
        if 0 <= index < total:
            return node
    raise ConfigError(f"{what} {index!r} is outside a layout of {sum(per_node)} "
                      f"{what}s; valid: 0..{sum(per_node) - 1}")


def _times(per_node: tuple[int, ...]) -> str:
    """``2x8`` for (8, 8); ``6+5`` for an uneven spread."""
    if len(set(per_node)) == 1:
        return f"{len(per_node)}x{per_node[0]}"
    return "+".join(map(str, per_node))


def train_layout(gpus: int, gpus_per_node: int) -> TrainLayout:
    """``gpus`` ranks over ``ceil(gpus / gpus_per_node)`` nodes."""
    return TrainLayout(spread(gpus, nodes_for(gpus, gpus_per_node)))


def engine_choices(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """The valid GPUs per engine for ``gpus`` rollout GPUs: divisors of ``gpus``, at
    most a node, whose engines fit the ``ceil(gpus / gpus_per_node)`` nodes the
    rollout takes (``gpus_per_node // T`` engines per node)."""
    nodes = nodes_for(gpus, gpus_per_node)
    return tuple(t for t in range(1, min(gpus, gpus_per_node) + 1)
                 if gpus % t == 0 and nodes_for(gpus // t, gpus_per_node // t) == nodes)


def rollout_layout(gpus: int, gpus_per_node: int, engine_gpus: int,
                   where: str = "gpus.engine") -> RolloutLayout:
    """``gpus / engine_gpus`` engines over ``ceil(gpus / gpus_per_node)`` nodes; an
    engine size not in :func:`engine_choices` is a ConfigError naming ``where``."""
    valid = engine_choices(gpus, gpus_per_node)
    if engine_gpus not in valid:
        raise ConfigError(
            f"key '{where}' = {engine_gpus!r}: GPUs per rollout engine must divide "
            f"gpus.rollout = {gpus} and fit a node of {gpus_per_node} GPUs; valid: "
            f"{', '.join(map(str, valid))}")
    return RolloutLayout(engine_gpus, spread(gpus // engine_gpus,
                                             nodes_for(gpus, gpus_per_node)))


def options_engine_gpus(options: Any) -> tuple[str, int] | None:
    """``(key, value)`` of ``[options.engine] tensor_parallel_size`` (or its older table
    name ``vllm``) if the spec gives it; ConfigError if it is not an integer >= 1."""
    opts = options_dict(options)
    for table in ("engine", "vllm"):
        sub = opts.get(table)
        if isinstance(sub, Mapping) and "tensor_parallel_size" in sub:
            key, value = f"options.{table}.tensor_parallel_size", sub["tensor_parallel_size"]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"key '{key}' = {value!r}: must be an integer >= 1 (GPUs "
                                  "per rollout engine)")
            return key, value
    return None


def default_engine_gpus(spec: JobSpec, site: SiteConfig) -> int:
    """The fewest valid GPUs per engine whose HBM holds the bf16 weights in at most
    :data:`~weave_slurm.model.perf.WEIGHT_HBM_FRACTION` of it (the rest is KV cache:
    the rollout model's replica, docs/model.md); if none does, the largest valid."""
    pool = site.rollout
    valid = engine_choices(spec.rollout_gpus, pool.gpus_per_node)
    w, hbm = perf.weights_gib(spec.model.params_b), pool.gpu.hbm_gib
    return next((t for t in valid if w / t <= perf.WEIGHT_HBM_FRACTION * hbm), valid[-1])


def engine_gpus_of(spec: JobSpec, site: SiteConfig) -> tuple[str, int]:
    """``(key, T)``: the spec's ``[gpus] engine``, else its ``[options.engine]
    tensor_parallel_size``, else the default; both given and different is refused."""
    given = options_engine_gpus(spec.options)
    if spec.engine_gpus is not None:
        if given is not None and given[1] != spec.engine_gpus:
            raise ConfigError(
                f"{spec.source}: key 'gpus.engine' = {spec.engine_gpus} but '{given[0]}' = "
                f"{given[1]}: both are the GPUs per rollout engine; give one, or the same "
                "value")
        return "gpus.engine", spec.engine_gpus
    if given is not None:
        return given
    return "gpus.engine", default_engine_gpus(spec, site)


def member_layout(spec: JobSpec, site: SiteConfig) -> MemberLayout:
    """The job's layout on ``site``: ConfigError naming the key for a bad engine size,
    InfeasibleRequest for more nodes than a pool has."""
    for role, gpus, pool in (("rollout", spec.rollout_gpus, site.rollout),
                             ("train", spec.train_gpus, site.train)):
        nodes = nodes_for(gpus, pool.gpus_per_node)
        if nodes > pool.max_nodes:
            raise InfeasibleRequest(
                f"{spec.source}: key 'gpus.{role}' needs {nodes} nodes but pool '{role}' "
                f"({pool.partition}) has max_nodes={pool.max_nodes}")
    key, engine = engine_gpus_of(spec, site)
    try:
        rollout = rollout_layout(spec.rollout_gpus, site.rollout.gpus_per_node, engine, key)
    except ConfigError as exc:
        raise ConfigError(f"{spec.source}: {exc}") from None
    return MemberLayout(train_layout(spec.train_gpus, site.train.gpus_per_node), rollout)


def single_layout() -> MemberLayout:
    """One rank, one one-GPU engine: what a member without a stored layout runs."""
    return MemberLayout(TrainLayout((1,)), RolloutLayout(1, (1,)))
