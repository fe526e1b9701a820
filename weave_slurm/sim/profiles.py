"""Per-kind phase times (``profile.json``) and the synthetic profile draw for bare traces.

A *kind* names a model size and a maximum response length, e.g. ``14B_8k`` = a 14B model
generating up to 8k (8,192) tokens. ``profile.json`` gives, per kind, the seconds of one
rollout (``generate``) and one training step (``train``) in two placements: ``disagg``
(rollout on h20, training on h800) and ``colo`` (both phases on the same h800 nodes).

Bare Philly traces carry no profiles. :class:`SyntheticProfileDistribution` draws one per
job the way the reference artifact built its ``*_parsed_all`` traces (facts read from
``global_scheduler/trace_sim.py``, ``generate_jobs``): pick one of nine classes with equal
probability - balanced, rollout-heavy, train-heavy, each small/mid/large - then draw the
rollout and train seconds uniformly from that class's ranges.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from weave_slurm.data import reference_file
from weave_slurm.errors import ConfigError

PLACEMENTS = ("disagg", "colo")
_KIND_RE = re.compile(r"^(\d+(?:\.\d+)?)B_(\d+)k\Z")


@dataclass(frozen=True, slots=True)
class PhaseSeconds:
    """Solo seconds of one rollout and one training step."""

    rollout_s: float
    train_s: float

    @property
    def iteration_s(self) -> float:
        return self.rollout_s + self.train_s


@dataclass(frozen=True, slots=True)
class JobKind:
    """Model size and maximum response length parsed from a kind name like ``32B_8k``."""

    name: str
    model_params_b: float
    max_response_tokens: int

    @classmethod
    def parse(cls, name: str) -> JobKind:
        match = _KIND_RE.match(name)
        if match is None:
            raise ConfigError(f"job kind {name!r} is not <params>B_<n>k (e.g. '14B_8k')")
        return cls(name, float(match.group(1)), int(match.group(2)) * 1024)

    @property
    def warm_state_gib(self) -> tuple[float, float]:
        """Warm state per node (rollout, training) for this model size:
        :func:`warm_state_gib`."""
        return warm_state_gib(self.model_params_b)

    @property
    def needs_two_nodes(self) -> bool:
        """The reference gives 32B jobs two rollout nodes (and its baselines two h800
        nodes); ``wild_trace_sim.py`` tests ``job_type.startswith('32B')``."""
        return self.model_params_b >= 32


#: Warm state per 8-GPU node measured by the paper (Weave, OSDI 2026), in GB: rollout
#: 275.7 (7B) to 490.3 (32B), training 240 to 520.4. Sizes in between are interpolated
#: linearly in the parameter count (and extrapolated for smaller models).
_STATE_ANCHORS_GB = {"rollout": ((7.0, 275.7), (32.0, 490.3)),
                     "train": ((7.0, 240.0), (32.0, 520.4))}
#: Model size assumed for a trace job that names none (bare Philly traces): the most
#: common size of the production trace.
DEFAULT_PARAMS_B = 7.0
_GIB_PER_GB = 1e9 / float(1 << 30)


def warm_state_gib(params_b: float = DEFAULT_PARAMS_B) -> tuple[float, float]:
    """(rollout, training) warm state per node in GiB for a ``params_b`` model."""
    out = []
    for pool in ("rollout", "train"):
        (x0, y0), (x1, y1) = _STATE_ANCHORS_GB[pool]
        gb = y0 + (params_b - x0) * (y1 - y0) / (x1 - x0)
        out.append(max(gb, 0.25 * y0) * _GIB_PER_GB)
    return out[0], out[1]


@dataclass(frozen=True, slots=True)
class ProfileTable:
    """Phase times per kind and placement, as read from a ``profile.json``."""

    disagg: Mapping[str, PhaseSeconds]
    colo: Mapping[str, PhaseSeconds]
    source: str

    def lookup(self, kind: str, placement: str = "disagg") -> PhaseSeconds | None:
        table = self.disagg if placement == "disagg" else self.colo
        return table.get(kind)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Kinds profiled in both placements, sorted by model size then length."""
        both = set(self.disagg) & set(self.colo)
        return tuple(sorted(both, key=_kind_sort_key))


def _kind_sort_key(name: str) -> tuple[float, int, str]:
    match = _KIND_RE.match(name)
    if match is None:
        return (math.inf, 0, name)
    return (float(match.group(1)), int(match.group(2)), name)


def default_profile_path() -> Path:
    return reference_file("profile.json")


def load_profile_table(path: Path | None = None) -> ProfileTable:
    """Read a ``profile.json``; defaults to the packaged reference copy."""
    path = path or default_profile_path()
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read profile file: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(raw, dict) or set(raw) != set(PLACEMENTS):
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise ConfigError(f"{path}: top-level keys must be exactly {list(PLACEMENTS)}, "
                          f"got {got!r}")
    tables = {p: _read_placement(path, p, raw[p]) for p in PLACEMENTS}
    return ProfileTable(tables["disagg"], tables["colo"], str(path))


def _read_placement(path: Path, placement: str, raw: object) -> dict[str, PhaseSeconds]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {placement!r} must map kind -> {{generate, train}}")
    table: dict[str, PhaseSeconds] = {}
    for kind, entry in raw.items():
        where = f"{path}: {placement}.{kind}"
        if not isinstance(entry, dict) or set(entry) != {"generate", "train"}:
            raise ConfigError(f"{where}: must have exactly keys 'generate' and 'train', "
                              f"got {entry!r}")
        values = [entry["generate"], entry["train"]]
        for key, value in zip(("generate", "train"), values, strict=True):
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"{where}.{key}: {value!r} is not a positive number")
        table[kind] = PhaseSeconds(float(values[0]), float(values[1]))
    return table


# (rollout_s range, train_s range) of the nine classes of the reference generator.
_SYNTHETIC_CLASSES: tuple[tuple[tuple[float, float], tuple[float, float]], ...] = (
    ((50, 100), (50, 100)), ((100, 200), (100, 200)), ((200, 300), (200, 300)),  # balanced
    ((100, 200), (25, 50)), ((200, 400), (50, 100)), ((400, 600), (100, 200)),  # rollout-heavy
    ((25, 50), (100, 200)), ((50, 100), (200, 400)), ((100, 200), (400, 600)),  # train-heavy
)
#: The reference generator's three train-heavy classes (rollout / training 0.125-0.5).
SYNTHETIC_TRAIN_HEAVY = _SYNTHETIC_CLASSES[6:]


@dataclass(frozen=True, slots=True)
class SyntheticProfileDistribution:
    """Draws a solo profile for a job that has none (bare Philly traces).

    ``classes`` are (rollout range, train range) pairs in seconds, picked with equal
    probability; the default reproduces the reference's ``all`` mix.
    """

    classes: tuple[tuple[tuple[float, float], tuple[float, float]], ...] = _SYNTHETIC_CLASSES

    def draw(self, rng: random.Random) -> PhaseSeconds:
        (r_lo, r_hi), (t_lo, t_hi) = self.classes[rng.randrange(len(self.classes))]
        return PhaseSeconds(rng.uniform(r_lo, r_hi), rng.uniform(t_lo, t_hi))
