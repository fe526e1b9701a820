"""Synthetic traces shaped like the paper's production mix.

Published statistics reproduced (Weave / RollMux, OSDI 2026, production replay): 200 jobs
over two weeks, Qwen-family models 3B-32B with maximum responses 4k-32k, mean lifetime
27.9 h, SLO uniform in [1, 2]. Kinds are drawn from the kinds in ``profile.json`` with
the frequencies of ``wild.trace``'s arrivals (counted from the packaged copy at run time).

Model (all draws from one ``random.Random(seed)``, in this order, so a seed fixes the
trace): arrival times are ``n_jobs`` uniform draws over ``arrival_window_s``, sorted - a
Poisson process conditioned on its count; then per job in arrival order: kind, lifetime,
SLO. Lifetimes are log-normal with log-sd ``lifetime_log_sd`` (1.03, fitted to
``wild.trace``), truncated to [``min_lifetime_s``, ``max_lifetime_s``] by redrawing (wild's
longest job ran 6.5 days), with the log-mean solved so that the truncated mean is
``mean_lifetime_s``.

Mixes (``mix``, ``weave trace generate --mix``) choose the kinds by the ratio of a kind's
solo rollout time to its solo training time per iteration, disaggregated (rollout on h20,
training on h800; ``profile.json``'s ``disagg``): ``wild`` draws kinds with
``wild.trace``'s arrival counts; ``rollout-heavy`` draws, with equal weights, the kinds
whose ratio is at least :data:`ROLLOUT_HEAVY_MIN_RATIO` (2.0); ``train-heavy`` those at
most :data:`TRAIN_HEAVY_MAX_RATIO` (1.25); ``mixed`` half its jobs from each of those two
sets (equal weights inside each). Kinds in between (ratio 1.25-2.0) are in ``wild`` only.
``synthetic-train-heavy`` jobs have no kind: their profiles come from the reference
generator's three train-heavy classes (``profiles.SYNTHETIC_TRAIN_HEAVY``, ratio
0.125-0.5, as in the ``*_parsed_all`` Philly traces), drawn from a second stream
``random.Random(f"weave-profile:{seed}")`` so that arrivals, lifetimes and SLOs are those
of the other mixes with the same seed; with no ``colo`` profile, co-location runs them
at their disaggregated phase times (``sim.policies`` falls back to those).
"""

from __future__ import annotations

import bisect
import enum
import math
import random
from dataclasses import dataclass, field
from datetime import datetime

from weave_slurm.data import reference_file
from weave_slurm.errors import ConfigError
from weave_slurm.sim.profiles import (
    SYNTHETIC_TRAIN_HEAVY,
    ProfileTable,
    SyntheticProfileDistribution,
    load_profile_table,
)
from weave_slurm.sim.reference_traces import parse_event_lines
from weave_slurm.sim.slo import SloDistribution
from weave_slurm.sim.traces import Trace, TraceFormat, TraceJob

DAY_S = 86400.0
HOUR_S = 3600.0

#: A kind is rollout-heavy where solo rollout / solo training per iteration >= this.
ROLLOUT_HEAVY_MIN_RATIO = 2.0
#: A kind is train-heavy where solo rollout / solo training per iteration <= this.
TRAIN_HEAVY_MAX_RATIO = 1.25


class TraceMix(enum.StrEnum):
    """Which kinds a generated trace draws (module docstring: the ratios)."""

    WILD = "wild"
    ROLLOUT_HEAVY = "rollout-heavy"
    TRAIN_HEAVY = "train-heavy"
    MIXED = "mixed"
    SYNTHETIC_TRAIN_HEAVY = "synthetic-train-heavy"


@dataclass(frozen=True)
class GeneratorConfig:
    """Knobs of :func:`generate_trace`; defaults are the paper's production mix."""

    n_jobs: int = 200
    arrival_window_s: float = 14 * DAY_S
    mean_lifetime_s: float = 27.9 * HOUR_S
    lifetime_log_sd: float = 1.03
    min_lifetime_s: float = 1800.0
    max_lifetime_s: float = 7 * DAY_S
    slo: SloDistribution = field(default_factory=lambda: SloDistribution.uniform(1.0, 2.0))
    kind_weights: tuple[tuple[str, float], ...] | None = None  # None: from ``mix``
    mix: TraceMix = TraceMix.WILD
    seed: int = 0
    id_prefix: str = "job"
    start_time: datetime = datetime(2025, 7, 30, 0, 0, 0)

    def __post_init__(self) -> None:
        if self.n_jobs < 1:
            raise ConfigError(f"--jobs {self.n_jobs!r} invalid; expected an integer >= 1")
        for name in ("arrival_window_s", "mean_lifetime_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} {value!r} invalid; expected a finite number > 0")
        if not math.isfinite(self.lifetime_log_sd) or self.lifetime_log_sd < 0:
            raise ConfigError(f"lifetime_log_sd {self.lifetime_log_sd!r} invalid; "
                              f"expected a finite number >= 0")
        if not 0 <= self.min_lifetime_s < self.mean_lifetime_s < self.max_lifetime_s:
            raise ConfigError(f"lifetime bounds min={self.min_lifetime_s!r}, "
                              f"mean={self.mean_lifetime_s!r}, max={self.max_lifetime_s!r} "
                              f"invalid; expected 0 <= min < mean < max")
        if self.kind_weights is not None and self.mix is not TraceMix.WILD:
            raise ConfigError(f"kind_weights and mix {self.mix.value!r} both given; "
                              f"expected one of them")


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def truncated_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """Mean of a log-normal(mu, sigma) restricted to [low, high]."""
    if sigma == 0:
        return min(max(math.exp(mu), low), high)
    log_low = math.log(low) if low > 0 else -math.inf
    log_high = math.log(high)
    mass = _phi((log_high - mu) / sigma) - _phi((log_low - mu) / sigma)
    shifted = (_phi((log_high - mu - sigma * sigma) / sigma)
               - _phi((log_low - mu - sigma * sigma) / sigma))
    return math.exp(mu + sigma * sigma / 2.0) * shifted / mass if mass > 0 else math.nan


def lifetime_log_mean(config: GeneratorConfig) -> float:
    """The log-mean whose truncated log-normal has mean ``config.mean_lifetime_s``."""
    sigma, target = config.lifetime_log_sd, config.mean_lifetime_s
    low, high = math.log(config.min_lifetime_s or 1e-9) - 10 * sigma, math.log(target)
    high += 10 * sigma + 1.0
    for _ in range(200):  # bisection: the truncated mean grows with mu
        mid = (low + high) / 2.0
        mean = truncated_lognormal_mean(mid, sigma, config.min_lifetime_s,
                                        config.max_lifetime_s)
        if math.isnan(mean) or mean < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def wild_kind_weights() -> tuple[tuple[str, float], ...]:
    """Arrivals per kind in the packaged ``wild.trace`` (sorted by kind name)."""
    path = reference_file("wild.trace")
    trace = parse_event_lines(path.read_text().splitlines(), TraceFormat.WILD, str(path))
    return tuple(sorted((k, float(n)) for k, n in trace.kind_counts().items()))


def rollout_train_ratio(profiles: ProfileTable, kind: str) -> float:
    """A kind's solo rollout time over its solo training time per iteration (disagg)."""
    phases = profiles.disagg[kind]
    return phases.rollout_s / phases.train_s


def mix_kind_weights(mix: TraceMix, profiles: ProfileTable
                     ) -> tuple[tuple[str, float], ...]:
    """The kinds a mix draws and their weights (sorted by kind name)."""
    if mix in (TraceMix.WILD, TraceMix.SYNTHETIC_TRAIN_HEAVY):  # the latter: kinds unused
        return wild_kind_weights()
    ratios = {kind: rollout_train_ratio(profiles, kind) for kind in profiles.kinds}
    bands = {TraceMix.ROLLOUT_HEAVY: (f">= {ROLLOUT_HEAVY_MIN_RATIO}",
                                      [k for k, r in ratios.items()
                                       if r >= ROLLOUT_HEAVY_MIN_RATIO]),
             TraceMix.TRAIN_HEAVY: (f"<= {TRAIN_HEAVY_MAX_RATIO}",
                                    [k for k, r in ratios.items()
                                     if r <= TRAIN_HEAVY_MAX_RATIO])}
    parts = list(bands) if mix is TraceMix.MIXED else [mix]
    weights: dict[str, float] = {}
    for part in parts:
        bound, kinds = bands[part]
        if not kinds:
            raise ConfigError(f"--mix {mix.value}: no kind in {profiles.source} has rollout / "
                              f"training {bound}; valid: wild, or a profile with such kinds")
        weights.update((kind, 1.0 / (len(parts) * len(kinds))) for kind in kinds)
    return tuple(sorted(weights.items()))


def _kind_table(config: GeneratorConfig, profiles: ProfileTable
                ) -> tuple[list[str], list[float]]:
    weights = (config.kind_weights if config.kind_weights is not None
               else mix_kind_weights(config.mix, profiles))
    kinds, cumulative, total = [], [], 0.0
    for kind, weight in weights:
        if kind not in profiles.kinds:
            raise ConfigError(f"kind {kind!r} has no profile in {profiles.source}; valid: "
                              f"{', '.join(profiles.kinds)}")
        if not math.isfinite(weight) or weight < 0:
            raise ConfigError(f"kind weight {kind}={weight!r} invalid; expected >= 0")
        if weight > 0:
            total += weight
            kinds.append(kind)
            cumulative.append(total)
    if not kinds:
        raise ConfigError("kind weights are all zero; expected at least one kind > 0")
    return kinds, cumulative


def generate_trace(config: GeneratorConfig | None = None,
                   profiles: ProfileTable | None = None) -> Trace:
    """A synthetic trace (deterministic for ``config.seed``)."""
    config = config or GeneratorConfig()
    profiles = profiles or load_profile_table()
    kinds, cumulative = _kind_table(config, profiles)
    rng = random.Random(config.seed)
    synthetic = (SyntheticProfileDistribution(SYNTHETIC_TRAIN_HEAVY)
                 if config.mix is TraceMix.SYNTHETIC_TRAIN_HEAVY else None)
    profile_rng = random.Random(f"weave-profile:{config.seed}")
    arrivals = sorted(rng.uniform(0.0, config.arrival_window_s) for _ in range(config.n_jobs))
    arrivals = [a - arrivals[0] for a in arrivals]  # the trace starts at its first arrival
    sigma = config.lifetime_log_sd
    mu = lifetime_log_mean(config)
    width = len(str(config.n_jobs - 1))
    jobs = []
    for index, arrival_s in enumerate(arrivals):
        pick = rng.random() * cumulative[-1]
        kind = kinds[min(bisect.bisect_right(cumulative, pick), len(kinds) - 1)]
        lifetime_s = _draw_lifetime(rng, mu, sigma, config)
        slo = config.slo.draw(rng)
        job_id = f"{config.id_prefix}{index:0{width}d}"
        if synthetic is not None:
            drawn = synthetic.draw(profile_rng)
            jobs.append(TraceJob(job_id=job_id, arrival_s=arrival_s,
                                 departure_s=arrival_s + lifetime_s, kind=None,
                                 t_rollout_s=drawn.rollout_s, t_train_s=drawn.train_s, slo=slo))
            continue
        disagg, colo = profiles.disagg[kind], profiles.colo[kind]
        jobs.append(TraceJob(
            job_id=job_id, arrival_s=arrival_s,
            departure_s=arrival_s + lifetime_s, kind=kind, t_rollout_s=disagg.rollout_s,
            t_train_s=disagg.train_s, slo=slo, t_rollout_colo_s=colo.rollout_s,
            t_train_colo_s=colo.train_s))
    mix = "" if config.kind_weights is not None or config.mix is TraceMix.WILD else (
        f", mix={config.mix.value}")
    source = f"generated(n={config.n_jobs}, seed={config.seed}{mix})"
    return Trace.from_jobs(jobs, start_time=config.start_time, source=source)


def _draw_lifetime(rng: random.Random, mu: float, sigma: float,
                   config: GeneratorConfig) -> float:
    for _ in range(10_000):
        value = rng.lognormvariate(mu, sigma)
        if config.min_lifetime_s <= value <= config.max_lifetime_s:
            return value
    raise ConfigError(f"lifetime bounds [{config.min_lifetime_s}, {config.max_lifetime_s}] s "
                      f"are too narrow for log-sd {sigma}; widen them")


def kind_frequencies(trace: Trace) -> dict[str, float]:
    """Share of jobs per kind."""
    counts = trace.kind_counts()
    total = sum(counts.values())
    return {kind: n / total for kind, n in counts.items()} if total else {}

