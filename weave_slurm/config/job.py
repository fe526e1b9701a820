"""Job specs (user-owned TOML): the RL job, its SLO and optionally its measured profile.

A spec says what the job is; :mod:`weave_slurm.model.profile` turns it into the
numbers placement needs, preferring measured values from ``[profile]`` over the
analytic estimates.
"""

from __future__ import annotations

import getpass
import os
import pwd
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from weave_slurm.config.launch import LaunchSpec, parse_launch
from weave_slurm.config.profile_table import MeasuredProfile, read_profile
from weave_slurm.config.reader import TableReader, parse_toml, read_toml
from weave_slurm.config.sbatch import NO_SLURM, JobSlurm, read_job_slurm
from weave_slurm.errors import ConfigError


class Algorithm(StrEnum):
    PPO = "ppo"
    GRPO = "grpo"
    DAPO = "dapo"
    RLOO = "rloo"
    REINFORCE_PP = "reinforce++"

    @property
    def has_critic(self) -> bool:
        return self is Algorithm.PPO


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
#: ``builtin:<name>`` or ``package.module:factory`` (what workloads.entry can load).
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
ENTRY_RE = re.compile(rf"^(?:builtin:[A-Za-z0-9][A-Za-z0-9._-]*|{_DOTTED}:{_DOTTED})$")
#: What a hosted spec without ``entry`` ran before such specs were refused at
#: submission (daemon/runnable.py): a job an older weaved stored so still runs it.
LEGACY_ENTRY = "builtin:grpo-toy"
#: ``[options]`` keys whose string value is a filesystem path (``out_dir``, ``data_path``...).
PATH_KEY_RE = re.compile(r"(?:^|_)(?:dir|path|file|root|prefix)$")
#: The most a spec may ask for per rollout: beyond these a value is a typo, not a job
#: (today's longest model contexts are ~1M tokens; the paper's trace runs 64 prompts x 8
#: samples a step and responses of 4k-32k tokens).
MAX_TOKENS = 1 << 20
MAX_PROMPTS_PER_STEP = 1 << 16
MAX_SAMPLES_PER_PROMPT = 1 << 12

#: A scalar ``[options]`` value.
OptionScalar = str | int | float | bool
#: A frozen ``[options]`` value: a scalar, a list of scalars (a tuple of scalars) or a
#: nested table (a non-empty tuple of ``(key, value)`` pairs sorted by key), so that a
#: spec stays hashable. :func:`options_dict` turns it back into dicts and lists.
OptionValue = OptionScalar | tuple["OptionValue", ...]
#: The frozen ``[options]`` table: ``(key, value)`` pairs sorted by key.
Options = tuple[tuple[str, OptionValue], ...]
#: How deep tables may nest under ``[options]`` (``[options.engine]`` is depth 1).
MAX_OPTION_DEPTH = 4


@dataclass(frozen=True, slots=True)
class ModelSpec:
    params_b: float
    layers: int | None = None
    hidden: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    prompts_per_step: int
    samples_per_prompt: int
    max_response_tokens: int
    prompt_tokens: int = 512
    mean_response_tokens: int | None = None

    @property
    def sequences(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    epochs: int = 1


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    user: str
    algorithm: Algorithm
    model: ModelSpec
    rollout: RolloutSpec
    training: TrainingSpec
    rollout_gpus: int
    train_gpus: int
    slo: float | None
    entry: str | None   # None: a planning-only spec (weave plan/simulate; not submitted)
    profile: MeasuredProfile
    source: str = "<string>"
    staleness: int = 0
    iterations: int = 10  # training steps (weight versions) to run, then the job ends
    seed: int = 0  # the entry point's seed (same seed -> same weights)
    options: Options = ()               # [options] for the entry, frozen (see OptionValue)
    # the user's own code (docs/job_api.md, "Your own code"): None / () = weave's defaults
    workdir: str | None = None          # the workers' working directory
    python: str | None = None           # the workers' interpreter (a venv's bin/python)
    pythonpath: tuple[str, ...] = ()    # put first on the workers' sys.path
    engine_gpus: int | None = None      # [gpus] engine: GPUs per rollout engine (tensor parallel)
    launch: LaunchSpec | None = None    # [launch]: a cooperative job (config/launch.py)
    slurm: JobSlurm = NO_SLURM          # [slurm]: account, qos, time limit, output (sbatch.py)
    solo: bool = False                  # never shares a group (weave-sbatch --solo)


def load_job(path: str | Path) -> JobSpec:
    path = Path(path)
    return _job_from_data(read_toml(path), str(path))


def parse_job(text: str, source: str = "<string>") -> JobSpec:
    return _job_from_data(parse_toml(text, source), source)


def _job_from_data(data: object, source: str) -> JobSpec:
    top = _SpecReader(data, source)
    name = top.string("name")
    if not NAME_RE.match(name):
        raise top.fail("name", name, "must be 1-64 characters of letters, digits, '.', '_', "
                       "'-', starting with a letter or digit")
    user = top.string("user", _current_user())
    algorithm = Algorithm(top.string("algorithm", "grpo", choices=[a.value for a in Algorithm]))
    slo = top.opt_number("slo", ge=1.0)
    staleness = _staleness(top)
    entry = top.opt_string("entry")
    if entry is not None and not ENTRY_RE.match(entry):
        raise top.fail("entry", entry, "must be 'builtin:<name>' or 'package.module:factory'")
    iterations = top.integer("iterations", 10, ge=1)
    seed = top.integer("seed", 0, ge=0)
    solo = top.boolean("solo", False)
    options = _options(top)
    workdir, python = top.opt_path("workdir"), top.opt_path("python")
    pythonpath = top.path_list("pythonpath")
    model = _model(_req(top, "model"))
    rollout = _rollout(_req(top, "rollout"))
    training = TrainingSpec()
    ttab = top.table("training", required=False)
    if ttab is not None:
        training = TrainingSpec(epochs=ttab.integer("epochs", 1, ge=1))
        ttab.done()
    gpus = _req(top, "gpus")
    rollout_gpus = gpus.integer("rollout", gt=0)
    train_gpus = gpus.integer("train", gt=0)
    engine_gpus = gpus.opt_integer("engine", gt=0)  # checked against the site: model/layout
    gpus.done()
    ptab = top.table("profile", required=False)
    profile = read_profile(ptab) if ptab is not None else MeasuredProfile()
    slurm = read_job_slurm(top.table("slurm", required=False))
    launch = parse_launch(top, staleness)
    top.done()
    return JobSpec(name=name, user=user, algorithm=algorithm, model=model, rollout=rollout,
                   training=training, rollout_gpus=rollout_gpus, train_gpus=train_gpus,
                   slo=slo, entry=entry, profile=profile, source=source, staleness=staleness,
                   iterations=iterations, seed=seed, options=options, workdir=workdir,
                   python=python, pythonpath=pythonpath, engine_gpus=engine_gpus,
                   slurm=slurm, launch=launch, solo=solo)


#: Most entries a spec's ``pythonpath`` may have (each is checked at submission).
MAX_PYTHONPATH = 16


class _SpecReader(TableReader):
    """The top level of a spec: also reads the keys naming the user's own code."""

    def opt_path(self, name: str) -> str | None:
        value = self.opt_string(name)
        if value is not None and not value.strip():
            raise self.fail(name, value, "must not be empty (leave the key out for the "
                            "default)")
        return value

    def path_list(self, name: str) -> tuple[str, ...]:
        """A list of path strings (``pythonpath = ["/a", "/b"]``); ``()`` if absent."""
        value = self._get(name, list, None, False)
        if value is None:
            return ()
        for item in value:
            if not isinstance(item, str) or not item.strip():
                raise self.fail(name, value, "must be a list of paths (non-empty strings), "
                                'e.g. ["/home/alice/proj/src"]')
        if len(value) > MAX_PYTHONPATH:
            raise self.fail(name, value, f"at most {MAX_PYTHONPATH} entries")
        return tuple(value)


def _options(top: TableReader) -> Options:
    """``[options]``: keys handed to the entry point: scalars (``task = "copy"``), lists
    of scalars, and nested tables of those (``[options.engine] tensor_parallel_size = 2``)."""
    raw = top.raw("options")
    if raw is None:
        return ()
    top.table("options")  # a table, or a one-line error naming the key
    return _freeze_table(top, raw, "options", 0)


def _freeze_table(top: TableReader, table: dict[str, object], key: str,
                  depth: int) -> Options:
    return tuple((name, _freeze_value(top, value, f"{key}.{name}", depth))
                 for name, value in sorted(table.items()))


def _freeze_value(top: TableReader, value: object, key: str, depth: int) -> OptionValue:
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list):
        if all(isinstance(item, str | int | float | bool) for item in value):
            return tuple(value)
        raise top.fail(key, value, "a list must hold strings, numbers or booleans only "
                       "(no lists of lists or of tables)")
    if isinstance(value, dict):
        if not value:
            raise top.fail(key, value, "an empty table; leave it out")
        if depth + 1 > MAX_OPTION_DEPTH:
            raise top.fail(key, value, f"tables nest at most {MAX_OPTION_DEPTH} deep under "
                           "[options]")
        return _freeze_table(top, value, key, depth + 1)
    raise top.fail(key, value, "must be a string, number, boolean, a list of those or a "
                   "table of those")


def options_dict(options: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> dict[str, Any]:
    """``[options]`` as the job sees them: nested tables as dicts, lists as lists.

    Takes the frozen form (:data:`Options`), a dict of it (``dict(spec.options)``) or
    that dict after a JSON round trip (tables become lists of ``[key, value]`` pairs):
    a non-empty sequence of ``(str, value)`` pairs is a table (a list of scalars never
    holds pairs, and the spec has no empty tables).
    """
    items = options.items() if isinstance(options, Mapping) else options
    return {str(key): _thaw(value) for key, value in items}


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return options_dict(value)
    if isinstance(value, list | tuple):
        if value and all(_is_pair(item) for item in value):
            return options_dict(value)
        return list(value)
    return value


def _is_pair(item: object) -> bool:
    return isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[0], str)


def option_leaves(options: Options, prefix: str = "options") -> Iterator[tuple[str, str, object]]:
    """Every scalar of ``[options]``, nested ones too: ``(dotted key, the key's own
    name, value)``; a list's items as ``key[i]``."""
    for name, value in options:
        key = f"{prefix}.{name}"
        if isinstance(value, tuple) and value and all(_is_pair(v) for v in value):
            yield from option_leaves(value, key)  # type: ignore[arg-type]
        elif isinstance(value, tuple):
            yield from ((f"{key}[{i}]", name, item) for i, item in enumerate(value))
        else:
            yield key, name, value


#: Largest dependency window accepted: beyond a few steps a job is effectively
#: asynchronous and its rollout and training no longer leave a bubble to share.
MAX_STALENESS = 8


def _staleness(top: TableReader) -> int:
    """``staleness = k``: rollout of step m may use weights of step m - 1 - k (0 = on-policy)."""
    if top.has("staleness") and not isinstance(top.raw("staleness"), int | bool):
        value = top.raw("staleness")
        if isinstance(value, str) and value.strip().lower() in ("unbounded", "inf", "async"):
            raise top.fail("staleness", value, "fully asynchronous jobs (no staleness bound) "
                           "have no rollout/training bubble for co-execution to fill, so "
                           "weave-slurm does not take them; give a bound 0-"
                           f"{MAX_STALENESS} (0 = strictly on-policy, 1 = one-step "
                           "off-policy)")
    return top.integer("staleness", 0, ge=0, le=MAX_STALENESS)


def _req(top: TableReader, name: str) -> TableReader:
    tab = top.table(name)
    assert tab is not None  # required=True raises instead of returning None
    return tab


def _model(r: TableReader) -> ModelSpec:
    spec = ModelSpec(
        params_b=r.number("params_b", gt=0, le=10_000),
        layers=r.opt_integer("layers", gt=0),
        hidden=r.opt_integer("hidden", gt=0),
        kv_heads=r.opt_integer("kv_heads", gt=0),
        head_dim=r.opt_integer("head_dim", gt=0),
    )
    r.done()
    return spec


def _rollout(r: TableReader) -> RolloutSpec:
    spec = RolloutSpec(
        prompts_per_step=r.integer("prompts_per_step", gt=0, le=MAX_PROMPTS_PER_STEP),
        samples_per_prompt=r.integer("samples_per_prompt", gt=0, le=MAX_SAMPLES_PER_PROMPT),
        max_response_tokens=r.integer("max_response_tokens", gt=0, le=MAX_TOKENS),
        prompt_tokens=r.integer("prompt_tokens", 512, gt=0, le=MAX_TOKENS),
        mean_response_tokens=r.opt_integer("mean_response_tokens", gt=0),
    )
    mean = spec.mean_response_tokens
    if mean is not None and mean > spec.max_response_tokens:
        raise r.fail("mean_response_tokens", spec.mean_response_tokens,
                     f"must be <= max_response_tokens ({spec.max_response_tokens})")
    r.done()
    return spec


def _looks_like_path(value: str) -> bool:
    """Absolute, home-relative or dot-relative, or climbing (``a/../b``); not ``org/model``."""
    return value.startswith(("/", "~", "./", "../")) or value == ".." \
        or "/../" in value or value.endswith("/..")


def code_paths(job: JobSpec) -> list[tuple[str, str]]:
    """``(key, value)`` of the paths naming the user's own code on the hosts: ``workdir``,
    ``python``, each ``pythonpath[i]``."""
    out = [(key, value) for key, value in (("workdir", job.workdir), ("python", job.python))
           if value is not None]
    return out + [(f"pythonpath[{i}]", p) for i, p in enumerate(job.pythonpath)]


def spec_paths(job: JobSpec) -> list[tuple[str, str]]:
    """``(key, value)`` of every spec value that names a filesystem path: the code paths
    (:func:`code_paths`), and a string ``[options]`` value whose key says so
    (:data:`PATH_KEY_RE`) or that looks like one."""
    return code_paths(job) + [
        (key, value) for key, name, value in option_leaves(job.options)
        if isinstance(value, str) and (PATH_KEY_RE.search(name) or _looks_like_path(value))]


def user_dirs(uid: int, roots: Sequence[Path] = ()) -> list[Path]:
    """Where ``uid``'s spec paths may point: its home, then the site's shared roots
    (all resolved, symlinks followed)."""
    try:
        home = [Path(os.path.realpath(pwd.getpwuid(uid).pw_dir))]
    except KeyError:
        home = []
    return [d for d in home if d != Path("/")] + [Path(os.path.realpath(r)) for r in roots]


#: Characters of a path a refusal quotes (a line, not a page).
SHOWN_CHARS = 160


def check_paths(job: JobSpec, uid: int, roots: Sequence[Path] = ()) -> None:
    """Refuse a spec path that escapes the submitter's own directories.

    A path must be absolute, have no ``..`` component, and resolve (every symlink
    followed) to its owner's home or below one of ``roots``; ConfigError names the key.
    ``python`` is resolved up to its directory only: a venv's ``bin/python`` is a
    symlink to the base interpreter, and it is the venv (where the link lies) that
    the job names. This is the check at submission; at run time the job's processes
    run as its uid, so the kernel refuses what a later-swapped symlink would reach.
    """
    paths = spec_paths(job)
    if not paths:  # most specs: no passwd lookup on the submit path
        return
    allowed = user_dirs(uid, roots)
    valid = f"valid: absolute paths under {', '.join(map(str, allowed)) or '(none)'}"
    for key, value in paths:
        where = f"{job.source}: key '{key}' = {value[:SHOWN_CHARS]!r}"
        path = PurePosixPath(value)
        if not value.isprintable() or not path.is_absolute():
            raise ConfigError(f"{where}: must be an absolute path (the job's processes do "
                              f"not run in your working directory); {valid}")
        if ".." in path.parts:
            raise ConfigError(f"{where}: '..' is not allowed in a path; {valid}")
        real = _resolved(key, value)
        if not any(real == d or d in real.parents for d in allowed):
            raise ConfigError(f"{where}: resolves to {str(real)[:SHOWN_CHARS]!r} (symlinks "
                              f"followed), outside your own directories; {valid}")


def _resolved(key: str, value: str) -> Path:
    if key == "python":
        return Path(os.path.realpath(os.path.dirname(value))) / os.path.basename(value)
    return Path(os.path.realpath(value))


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
