"""The site config (admin-owned TOML): pools, network tiers, prices, limits, defaults.

All defaults live in this module (``DEFAULT_*``); ``configs/site.example.toml``
documents every key. Frozen dataclasses, units in names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from weave_slurm.config.fairshare import (
    NO_LIMITS,
    FairShareConfig,
    JobLimits,
    read_fairshare,
    read_limits,
)
from weave_slurm.config.reader import TableReader, parse_toml, read_toml
from weave_slurm.config.runtime import RuntimeConfig, read_runtime
from weave_slurm.errors import ConfigError
from weave_slurm.vocab import Pool


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Public spec-sheet numbers of one GPU kind (see docs/model.md for sources)."""

    name: str
    hbm_gib: float
    hbm_tbps: float
    bf16_tflops: float


#: Spec-sheet defaults; a site may override or add kinds under ``[gpus.<name>]``.
DEFAULT_GPUS: dict[str, GpuSpec] = {
    "h20": GpuSpec("h20", hbm_gib=96.0, hbm_tbps=4.0, bf16_tflops=148.0),
    "h800": GpuSpec("h800", hbm_gib=80.0, hbm_tbps=3.35, bf16_tflops=989.0),
    "h100": GpuSpec("h100", hbm_gib=80.0, hbm_tbps=3.35, bf16_tflops=989.0),
    "a100": GpuSpec("a100", hbm_gib=80.0, hbm_tbps=2.0, bf16_tflops=312.0),
}


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One pool: a Slurm partition of identical nodes."""

    role: Pool
    partition: str
    gpu: GpuSpec
    gpus_per_node: int
    host_mem_gib: float
    price_per_gpu_hour: float
    max_nodes: int

    @property
    def price_per_node_hour(self) -> float:
        return self.price_per_gpu_hour * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    intra_pool_gbps: float = 400.0
    inter_pool_gbps: float = 20.0


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_group_size: int = 5
    max_rollout_nodes_per_group: int = 8
    # placement may admit a job co-located (its rollout on its own training nodes;
    # docs/placement.md "Co-location"); None: not set (the simulator's default is on,
    # weaved's off: daemon/colocating.py)
    colocation: bool | None = None
    # how weaved's groups hold their rollout side: "pinned" (whole nodes, each member
    # pinned to some) or "pooled" (GPU shares every member's rollout spans in turn:
    # daemon/pooling.py); unset: pooled where [runtime] gangs is on (a pooled rollout
    # runs as engines), else pinned (``_rollout``); the simulator's is its --rollout flag
    rollout: str = "pooled"
    user: JobLimits = NO_LIMITS        # [limits.user]: what one user may have
    account: JobLimits = NO_LIMITS     # [limits.account]: one account, its users together
    # Slurm's associations and QOS limits too, read with sacctmgr (docs/fairshare.md)
    from_slurm: bool = False
    slurm_refresh_s: float = 60.0      # how often weaved reads them again
    slurm_cluster: str | None = None   # their cluster (None: slurm.conf's ClusterName)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Efficiency knobs of the analytic performance model (docs/model.md)."""

    train_mfu: float = 0.35
    decode_bw_efficiency: float = 0.6
    rollout_mean_fraction: float = 0.8
    colo_switch_s: float = 10.0


#: What Slurm accepts in an account or QOS name (sacctmgr's own rule is looser; these
#: never need quoting in an argv, a comment or a log line).
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
#: The longest time limit a site may set (365 days, in minutes).
MAX_TIME_LIMIT_MIN = 365 * 24 * 60


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """What every allocation weaved holds is charged to (``[slurm]``; None: Slurm's
    default): ``#SBATCH --account``, ``--qos`` and ``--time`` (minutes) of the allocation
    script weaved submits, which may be the site's own (``allocation_template``). A group's
    allocation that reaches its time limit is ended by Slurm, and weaved handles it
    as a lost allocation (docs/accounting.md)."""

    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None
    #: The site's own allocation script (None: the shipped ``sbatch_templates/
    #: allocation.sbatch``); a relative path is relative to the site file.
    allocation_template: Path | None = None


@dataclass(frozen=True, slots=True)
class SiteConfig:
    name: str
    currency: str
    rollout: PoolConfig
    train: PoolConfig
    network: NetworkConfig = field(default_factory=NetworkConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    fairshare: FairShareConfig = field(default_factory=FairShareConfig)
    default_slo: float = 1.5
    source: str = "<builtin>"

    def pool(self, role: Pool) -> PoolConfig:
        return self.rollout if role is Pool.ROLLOUT else self.train


# Defaults matching the paper's evaluation: an H800 GPU-hour costs 2.85x an H20
# GPU-hour; 5.28 $/h per H800 GPU is the reference artifact's dollar rate.
H800_PRICE_PER_GPU_HOUR = 5.28
H20_PRICE_PER_GPU_HOUR = round(H800_PRICE_PER_GPU_HOUR / 2.85, 4)


def default_site() -> SiteConfig:
    """The built-in site: two 41-node (328-GPU) pools as in the paper's testbed.

    It is what weaved runs on without a site file: a try-out on one host (the demo,
    the embedded local backend). A job runs every rank and engine its layout places,
    as on any site (on CPU the ranks are small, not fewer).
    """
    return SiteConfig(
        name="default",
        currency="USD",
        rollout=PoolConfig(Pool.ROLLOUT, "h20", DEFAULT_GPUS["h20"], 8, 2048.0,
                           H20_PRICE_PER_GPU_HOUR, 41),
        train=PoolConfig(Pool.TRAIN, "h800", DEFAULT_GPUS["h800"], 8, 2048.0,
                         H800_PRICE_PER_GPU_HOUR, 41),
    )


def load_site(path: str | Path) -> SiteConfig:
    path = Path(path)
    return _site_from_data(read_toml(path), str(path))


def parse_site(text: str, source: str = "<string>") -> SiteConfig:
    return _site_from_data(parse_toml(text, source), source)


def _site_from_data(data: object, source: str) -> SiteConfig:
    base = default_site()
    top = TableReader(data, source)
    site = top.table("site", required=False)
    name, currency, default_slo = base.name, base.currency, base.default_slo
    if site is not None:
        name = site.string("name", name)
        currency = site.string("currency", currency)
        default_slo = site.number("default_slo", default_slo, ge=1.0)
        site.done()
    gpus = dict(DEFAULT_GPUS)
    gtab = top.table("gpus", required=False)
    if gtab is not None:
        for gname, g in top.subtables("gpus").items():
            gpus[gname] = GpuSpec(gname, g.number("hbm_gib", gt=0), g.number("hbm_tbps", gt=0),
                                  g.number("bf16_tflops", gt=0))
            g.done()
    pools_reader = top.table("pools")
    assert pools_reader is not None
    pools = top.subtables("pools")
    roles = {r.value for r in Pool}
    for pname in pools:
        if pname not in roles:
            raise ConfigError(f"{source}: unknown pool '[pools.{pname}]'; valid pools: "
                              f"{', '.join(sorted(roles))}")
    for role in Pool:
        if role.value not in pools:
            raise ConfigError(f"{source}: missing required table '[pools.{role.value}]'")
    rollout = _pool(pools["rollout"], Pool.ROLLOUT, base.rollout, gpus)
    train = _pool(pools["train"], Pool.TRAIN, base.train, gpus)
    if rollout.partition == train.partition:
        raise ConfigError(f"{source}: 'pools.rollout.partition' and 'pools.train.partition' "
                          f"are both {rollout.partition!r}; the rollout and training pools "
                          "must be two different Slurm partitions")
    network = base.network
    ntab = top.table("network", required=False)
    if ntab is not None:
        network = NetworkConfig(
            intra_pool_gbps=ntab.number("intra_pool_gbps", network.intra_pool_gbps, gt=0),
            inter_pool_gbps=ntab.number("inter_pool_gbps", network.inter_pool_gbps, gt=0))
        ntab.done()
    limits = replace(base.limits, rollout="")   # unset until the site says it
    ltab = top.table("limits", required=False)
    if ltab is not None:
        limits = LimitsConfig(
            max_group_size=ltab.integer("max_group_size", limits.max_group_size, ge=1, le=16),
            max_rollout_nodes_per_group=ltab.integer(
                "max_rollout_nodes_per_group", limits.max_rollout_nodes_per_group, ge=1),
            colocation=ltab.boolean("colocation", False) if ltab.has("colocation")
            else limits.colocation,
            rollout=ltab.string("rollout", "", choices=("pinned", "pooled"))
            if ltab.has("rollout") else "",
            user=read_limits(ltab.table("user", required=False)),
            account=read_limits(ltab.table("account", required=False)),
            from_slurm=ltab.boolean("from_slurm", limits.from_slurm),
            slurm_refresh_s=ltab.number("slurm_refresh_s", limits.slurm_refresh_s, gt=0),
            slurm_cluster=ltab.opt_string("slurm_cluster"))
        ltab.done()
    model = base.model
    mtab = top.table("model", required=False)
    if mtab is not None:
        model = ModelConfig(
            train_mfu=mtab.number("train_mfu", model.train_mfu, gt=0, le=1),
            decode_bw_efficiency=mtab.number("decode_bw_efficiency", model.decode_bw_efficiency,
                                             gt=0, le=1),
            rollout_mean_fraction=mtab.number("rollout_mean_fraction",
                                              model.rollout_mean_fraction, gt=0, le=1),
            colo_switch_s=mtab.number("colo_switch_s", model.colo_switch_s, ge=0))
        mtab.done()
    runtime = read_runtime(top.table("runtime", required=False))
    slurm = _slurm(top.table("slurm", required=False), _site_dir(source))
    fairshare = read_fairshare(top.table("fairshare", required=False))
    defaults = top.table("defaults", required=False)
    if defaults is not None:
        default_slo = defaults.number("slo", default_slo, ge=1.0)
        defaults.done()
    top.done()
    limits = replace(limits, rollout=_rollout(limits.rollout, runtime.gangs, source))
    return SiteConfig(name=name, currency=currency, rollout=rollout, train=train,
                      network=network, limits=limits, model=model, runtime=runtime,
                      slurm=slurm, fairshare=fairshare, default_slo=default_slo,
                      source=source)


def _rollout(said: str, gangs: bool, source: str) -> str:
    """``[limits] rollout`` as the site said it (``""``: unset), or its default: pooled
    where ``[runtime] gangs`` is on (not worse than pinned on any trace we ship:
    docs/simulator.md "Pooled rollout"), else pinned."""
    if said == "pooled" and not gangs:
        raise ConfigError(f"{source}: [limits] rollout = 'pooled' with [runtime] gangs = "
                          "false: a pooled member's rollout runs as one engine per GPU of its "
                          "pool, which a member of one process cannot; valid: gangs = true, "
                          "or rollout = 'pinned'")
    return said or ("pooled" if gangs else "pinned")


def _pool(r: TableReader, role: Pool, base: PoolConfig, gpus: dict[str, GpuSpec]) -> PoolConfig:
    gpu_name = r.string("gpu", base.gpu.name, choices=gpus)
    pool = PoolConfig(
        role=role,
        partition=r.string("partition", base.partition),
        gpu=gpus[gpu_name],
        gpus_per_node=r.integer("gpus_per_node", base.gpus_per_node, gt=0),
        host_mem_gib=r.number("host_mem_gib", base.host_mem_gib, gt=0),
        price_per_gpu_hour=r.number("price_per_gpu_hour", base.price_per_gpu_hour, ge=0),
        max_nodes=r.integer("max_nodes", base.max_nodes, gt=0),
    )
    r.done()
    return pool


def _site_dir(source: str) -> Path:
    """What a relative path in the site file is relative to (its directory; the current
    one for a site given as text)."""
    return Path(source).parent if not source.startswith("<") else Path.cwd()


def _slurm(r: TableReader | None, site_dir: Path) -> SlurmConfig:
    """``[slurm]``: account, qos (names), time_limit_min (minutes) and
    allocation_template (a file), all optional."""
    if r is None:
        return SlurmConfig()
    names = {}
    for key in ("account", "qos"):
        value = r.opt_string(key)
        if value is not None and not _SLURM_NAME.match(value):
            raise r.fail(key, value, "must be a Slurm name of 1-64 letters, digits, '_', "
                         "'.' or '-'")
        names[key] = value
    limit = r.opt_integer("time_limit_min")
    if limit is not None and not 1 <= limit <= MAX_TIME_LIMIT_MIN:
        raise r.fail("time_limit_min", limit, f"must be minutes between 1 and "
                     f"{MAX_TIME_LIMIT_MIN} (365 days); leave it out for the partition's "
                     "limit")
    template = r.opt_string("allocation_template")
    path = site_dir / template if template is not None else None
    if path is not None and not path.is_file():
        raise r.fail("allocation_template", template, f"{str(path)!r} is not a file; leave "
                     "the key out for the shipped sbatch_templates/allocation.sbatch")
    r.done()
    return SlurmConfig(account=names["account"], qos=names["qos"], time_limit_min=limit,
                       allocation_template=path)
