"""What a launched sync group does: the JSON-serialisable description of one run."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from weave_slurm.errors import ConfigError
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.topology import PoolNodes, SyncTopology, build_topology
from weave_slurm.vocab import Pool


class Method(enum.Enum):
    """How weights travel: the two-tier sync or one of the naive baselines."""

    TWOTIER = "twotier"
    NAIVE = "naive"
    FLAT = "flat"


class Backend(enum.Enum):
    GLOO = "gloo"
    MPI = "mpi"


@dataclass(frozen=True)
class Scenario:
    """One run of a sync group: who pushes which weight files as which versions.

    ``version_files[i]`` is a flat weight buffer (``total_nbytes`` bytes) pushed as
    version ``versions[i]`` (repeat or lower a number to provoke a refusal). Fault
    hooks for tests: ``corrupt_attempts`` (sender flips a byte in that many first sends
    of each piece) and ``die_rank``/``die_at`` (that rank SIGKILLs itself when it starts
    receiving a payload of the ``die_at``-th push).

    ``train_nodes``/``rollout_nodes`` name the nodes a pool's ranks run on (as the group
    runtime takes them from its allocations); empty means ``nodes_per_pool`` made-up
    nodes (``train0``, ``train1``, ...) on one machine.
    """

    job_id: str
    n_train: int
    n_rollout: int
    total_nbytes: int
    version_files: tuple[str, ...]
    versions: tuple[int, ...]
    word_bytes: int = 2
    method: Method = Method.TWOTIER
    mode: SyncMode = SyncMode.FULL
    backend: Backend = Backend.GLOO
    nodes_per_pool: int = 1
    timeout_s: float = 60.0
    verify: bool = True
    corrupt_attempts: int = 0
    die_rank: int = -1
    die_at: int = 0
    chunk_nbytes: int = 2 << 20
    verify_gather: bool = True
    train_nodes: tuple[str, ...] = ()
    rollout_nodes: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.version_files) != len(self.versions):
            raise ConfigError(f"scenario: {len(self.version_files)} version_files but "
                              f"{len(self.versions)} versions; give one version per file")
        if self.n_train < 1 or self.n_rollout < 1:
            raise ConfigError(f"scenario: n_train={self.n_train!r}, n_rollout="
                              f"{self.n_rollout!r}; both must be >= 1")
        for pool, names, n in ((Pool.TRAIN, self.train_nodes, self.n_train),
                               (Pool.ROLLOUT, self.rollout_nodes, self.n_rollout)):
            if len(names) > n:
                raise ConfigError(f"scenario: {len(names)} {pool.value} nodes "
                                  f"({', '.join(names)}) for {n} ranks; every node needs "
                                  "a rank, so give at most as many nodes as ranks")

    def node_names(self, pool: Pool) -> tuple[str, ...]:
        """The nodes ``pool``'s ranks run on: the given ones, else made-up names."""
        given = self.train_nodes if pool is Pool.TRAIN else self.rollout_nodes
        if given:
            return given
        n = self.n_train if pool is Pool.TRAIN else self.n_rollout
        return tuple(f"{pool.value}{i}" for i in range(max(1, min(self.nodes_per_pool, n))))

    def topology(self) -> SyncTopology:
        nodes: list[PoolNodes] = []
        for pool, n in ((Pool.TRAIN, self.n_train), (Pool.ROLLOUT, self.n_rollout)):
            names = self.node_names(pool)
            k = len(names)
            for i, name in enumerate(names):
                share = n // k + (1 if i < n % k else 0)
                nodes.append(PoolNodes(pool, name, share))
        return build_topology(nodes)

    def dump(self, path: Path) -> None:
        d: dict[str, Any] = asdict(self)
        d.update(method=self.method.value, mode=self.mode.name.lower(),
                 backend=self.backend.value)
        path.write_text(json.dumps(d))

    @classmethod
    def load(cls, path: Path) -> Scenario:
        d = json.loads(path.read_text())
        d.update(method=Method(d["method"]), mode=SyncMode[d["mode"].upper()],
                 backend=Backend(d["backend"]), version_files=tuple(d["version_files"]),
                 versions=tuple(d["versions"]), train_nodes=tuple(d["train_nodes"]),
                 rollout_nodes=tuple(d["rollout_nodes"]))
        return cls(**d)
