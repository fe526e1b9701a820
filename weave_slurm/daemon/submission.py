"""Turning what a user submits (a spec TOML, or a script with ``#WEAVE`` directives,
plus command-line flags) into the one canonical spec TOML the daemon stores.

Directives: lines ``#WEAVE --key=value`` (or ``--key value``) in the script's header,
i.e. before its first line that is neither blank nor a comment, as sbatch reads
``#SBATCH``. ``#SBATCH`` lines may say what :mod:`weave_slurm.config.sbatch` honours
(account, qos, time, output, error, job name, chdir); any other sbatch option is
refused in one line. Flags on
the command line win over directives, which win over the spec file. A list-valued
option (``--pythonpath``) takes ``:``-separated paths and may be given more than once
(the lists add up); on the command line it replaces the directives' list.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weave_slurm.config import dependency, job_array, launch, sbatch
from weave_slurm.config.job import JobSpec, parse_job
from weave_slurm.errors import ConfigError


@dataclass(frozen=True)
class Directive:
    flag: str
    path: tuple[str, ...]  # key path in the spec
    kind: type
    help: str
    parse: Callable[[str], Any] | None = None   # checks and converts a str value


DIRECTIVES: tuple[Directive, ...] = (
    Directive("job-name", ("name",), str, "job name (also #SBATCH -J/--job-name)"),
    Directive("account", ("slurm", "account"), str, "Slurm account charged (-A)",
              sbatch.slurm_name),
    Directive("qos", ("slurm", "qos"), str, "Slurm QOS (-q)", sbatch.slurm_name),
    Directive("time", ("slurm", "time_limit_min"), int,
              f"the job's time limit (-t): {sbatch.TIME_FORMATS}", sbatch.parse_time_min),
    Directive("output", ("slurm", "output"), str,
              "where the job's output goes (-o; %j job id, %u user, %x job name)",
              sbatch.log_pattern),
    Directive("error", ("slurm", "error"), str,
              "where the job's errors go (-e; default: with --output)", sbatch.log_pattern),
    Directive("dependency", ("slurm", "dependency"), str,
              f"start after other jobs (-d): {dependency.FORMS}", dependency.dependency_text),
    Directive("array", ("slurm", "array"), str, f"one job per element (-a): "
              f"{job_array.FORMS}", job_array.array_text),
    Directive("hold", ("slurm", "hold"), bool, "submit held: PENDING until weave release "
              "(-H)", launch.yes),
    Directive("container", ("slurm", "container"), str, "an OCI bundle the job's processes "
              "run in (a directory with config.json and rootfs/; docs/job_api.md)"),
    Directive("slo", ("slo",), float, "permitted slowdown, >= 1.0 (e.g. 1.5)"),
    Directive("rollout-gpus", ("gpus", "rollout"), int, "GPUs of the rollout phase"),
    Directive("train-gpus", ("gpus", "train"), int, "GPUs of the training phase"),
    Directive("engine-gpus", ("gpus", "engine"), int,
              "GPUs per rollout engine (tensor parallel; default: docs/job_api.md)"),
    Directive("max-tokens", ("rollout", "max_response_tokens"), int,
              "max response tokens per rollout sample"),
    Directive("prompts-per-step", ("rollout", "prompts_per_step"), int,
              "prompts per step (default 64)"),
    Directive("samples-per-prompt", ("rollout", "samples_per_prompt"), int,
              "samples per prompt (default 8)"),
    Directive("model-params-b", ("model", "params_b"), float, "model size, billions of params"),
    Directive("algorithm", ("algorithm",), str, "ppo, grpo, dapo, rloo or reinforce++"),
    Directive("entry", ("entry",), str, "entry point (module:Class or builtin:NAME)"),
    Directive("iterations", ("iterations",), int, "training steps to run (default 10)"),
    Directive("seed", ("seed",), int, "the entry point's seed (default 0)"),
    Directive("staleness", ("staleness",), int,
              "dependency window k: rollout of step m may use weights of m - 1 - k (default 0)"),
    Directive("rollout-s", ("profile", "rollout_s"), float, "measured rollout seconds"),
    Directive("train-s", ("profile", "train_s"), float, "measured training seconds"),
    Directive("rollout-state-gib", ("profile", "rollout_state_gib"), float,
              "warm rollout state per node, GiB"),
    Directive("train-state-gib", ("profile", "train_state_gib"), float,
              "warm training state per node, GiB"),
    Directive("workdir", ("workdir",), str, "the workers' working directory (absolute path)"),
    Directive("python", ("python",), str,
              "the workers' interpreter, e.g. /home/alice/venv/bin/python"),
    Directive("pythonpath", ("pythonpath",), list,
              "import paths put first on the workers' sys.path (':'-separated, may repeat)"),
    Directive("solo", ("solo",), bool, "run alone: never share a group (to compare its "
              "final weights with a grouped run's)", launch.yes),
    # a cooperative job (config/launch.py): the script's body runs, one process per role
    Directive("cooperative", ("launch", "script"), str, "run this script's body as the "
              "job's own processes, one per role (docs/job_api.md)", launch.yes),
    Directive("rollout-cmd", ("launch", "rollout"), str,
              "cooperative: the rollout role's launcher line (default: the script)"),
    Directive("train-cmd", ("launch", "train"), str,
              "cooperative: the training role's launcher line (default: the script)"),
    Directive("object-store-gib", ("launch", "object_store_gib"), float,
              "cooperative: host memory its processes hold per node besides its state "
              "(a Ray object store), GiB"),
)
BY_FLAG = {d.flag: d for d in DIRECTIVES}
#: What a script must say (a spec file says it in TOML).
SCRIPT_REQUIRED = ("model-params-b", "rollout-gpus", "train-gpus", "max-tokens")
SCRIPT_DEFAULTS: dict[str, Any] = {"rollout": {"prompts_per_step": 64, "samples_per_prompt": 8}}
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")
_BARE = re.compile(r"^[A-Za-z0-9_-]+\Z")
_SWITCHES = ("cooperative", "solo", "hold")   # options that take no value (on when given)


def convert(flag: str, raw: str, where: str) -> Any:
    d = BY_FLAG.get(flag)
    if d is None:
        raise ConfigError(f"{where}: unknown option '--{flag}'; valid: "
                          f"{', '.join('--' + x.flag for x in DIRECTIVES)}")
    if d.parse is not None:
        try:
            return d.parse(raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: --{flag}={raw!r}: {exc}") from None
    if d.kind is str:
        return raw
    if d.kind is list:
        paths = [p for p in raw.split(":") if p]
        if not paths:
            raise ConfigError(f"{where}: --{flag}={raw!r} names no path ({d.help})")
        return paths
    try:
        return d.kind(raw)
    except ValueError:
        kind = "an integer" if d.kind is int else "a number"
        raise ConfigError(f"{where}: --{flag}={raw!r} is not {kind} ({d.help})") from None


def sbatch_flags(**given: str | None) -> dict[str, Any]:
    """weave-sbatch's ``--account``, ``--qos``, ``--time``, ``--output``, ``--error``
    (those given), converted as their directives are; a bad one is one line naming it."""
    out: dict[str, Any] = {}
    for flag, raw in given.items():
        if raw is not None:
            out[flag] = convert(flag, raw, "command line")
    return out


def _tokens(words: list[str], where: str) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(words):
        w = words[i]
        if not w.startswith("-"):
            raise ConfigError(f"{where}: expected an option like --slo=1.5, got {w!r}")
        short = sbatch.expand_short(w)
        key, eq, val = w.lstrip("-").partition("=")
        if short is not None:
            key, eq, val = short[0], "=" if short[1] is not None else "", short[1] or ""
        if not eq and key in _SWITCHES:   # no value
            eq, val = "=", "yes"
        if not eq:
            if i + 1 >= len(words):
                raise ConfigError(f"{where}: option {w!r} needs a value")
            val, i = words[i + 1], i + 1
        out.append((key, val))
        i += 1
    return out


def read_directives(text: str, source: str) -> dict[str, Any]:
    """``{flag: value}`` from a script's ``#WEAVE`` and ``#SBATCH`` header lines."""
    found: dict[str, Any] = {}
    refused: list[sbatch.Unhonoured] = []
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#"):
            break
        where = f"{source}:{no}"
        for tag in ("#WEAVE", "#SBATCH"):
            if not s.startswith(tag + " ") and s != tag:
                continue
            try:
                words = shlex.split(s[len(tag):], comments=False)
            except ValueError as exc:
                raise ConfigError(f"{where}: cannot parse {tag} line ({exc})") from None
            if tag == "#SBATCH":
                pairs, unhonoured = sbatch.sbatch_scan(words, where)
                refused += unhonoured
            elif not words:
                raise ConfigError(f"{where}: empty #WEAVE directive")
            else:
                pairs = _tokens(words, f"{where}: #WEAVE")
            for key, val in pairs:
                value = convert(key, val, f"{where}: {tag}")
                if isinstance(value, list):
                    value = [*found.get(key, []), *value]
                found[key] = value
    if refused:   # every one at once, each with what to do instead
        raise sbatch.refusal(refused)
    return found


def _set(data: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        node = data.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"key {key!r} must be a table to set {'.'.join(path)}")
        data = node
    data[path[-1]] = value


def apply_options(data: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(data))
    for flag, value in options.items():
        if value is None:   # e.g. --time=UNLIMITED: no limit of its own
            _unset(out, BY_FLAG[flag].path)
        else:
            _set(out, BY_FLAG[flag].path, value)
    return out


def _unset(data: dict[str, Any], path: Sequence[str]) -> None:
    for key in path[:-1]:
        node = data.get(key)
        if not isinstance(node, dict):
            return
        data = node
    data.pop(path[-1], None)


def to_toml(data: Mapping[str, Any]) -> str:
    """TOML for a spec-shaped mapping (scalars, lists of scalars, nested tables)."""
    lines: list[str] = []
    _emit(data, (), lines)
    return "\n".join(lines).strip() + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {type(v).__name__} value {v!r} to TOML")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _emit(data: Mapping[str, Any], prefix: tuple[str, ...], lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    if prefix and (len(tables) < len(data) or not data):
        lines.append(f"\n[{'.'.join(_key(p) for p in prefix)}]")
    for k, v in data.items():
        if not isinstance(v, dict):
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in tables.items():
        _emit(v, (*prefix, k), lines)


def _script_name(path: Path) -> str:
    name = _NAME_BAD.sub("-", path.stem)[:64].lstrip("._-")
    return name or "script"


#: sbatch's input environment variables that map to weave's flags (as sbatch: they
#: override the script's directives; the command line overrides them). Others, such as
#: ``SBATCH_PARTITION``, are left alone: weave picks a group's partitions itself.
SBATCH_ENV: dict[str, str] = {"SBATCH_ACCOUNT": "account", "SBATCH_QOS": "qos",
                              "SBATCH_TIMELIMIT": "time", "SBATCH_JOB_NAME": "job-name",
                              "SBATCH_OUTPUT": "output", "SBATCH_ERROR": "error",
                              "SBATCH_ARRAY_INX": "array",
                              "SBATCH_CONTAINER": "container"}


def env_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """The flags ``SBATCH_*`` variables set, converted as their directives are; a bad
    value is one line naming the variable."""
    return {flag: convert(flag, environ[var], f"environment {var}")
            for var, flag in SBATCH_ENV.items() if environ.get(var)}


def wrap_script(command: str) -> str:
    """sbatch's ``--wrap``: the command as the body of a ``sh`` script."""
    if not command.strip():
        raise ConfigError("--wrap: the command is empty")
    return f"#!/bin/sh\n{command}\n"


def build_spec(path: Path, options: Mapping[str, Any],
               environ: Mapping[str, str] | None = None,
               text: str | None = None) -> tuple[str, JobSpec]:
    """The canonical spec TOML for ``path`` (a .toml spec or a script) and ``options``;
    ``text``: the script itself when it is not read from ``path`` (stdin, ``--wrap``;
    ``path`` then names it). A cooperative job without ``[launch.env]`` gets ``environ``
    (the submitter's). A relative ``workdir`` (``-D``) is taken from the current
    directory, as sbatch does."""
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read ({exc})") from exc
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        if options.get("cooperative"):
            raise ConfigError(f"{path}: --cooperative runs a script's body; a spec names "
                              "its commands in [launch] (rollout, train or script)")
        merged = apply_options(data, _absolute_workdir(options))
    else:
        directives = {**read_directives(text, str(path)), **options}
        missing = [f for f in SCRIPT_REQUIRED if f not in directives]
        if missing:
            raise ConfigError(f"{path}: missing {', '.join('#WEAVE --' + f for f in missing)}"
                              f" ({'; '.join(BY_FLAG[f].help for f in missing)})")
        base = {"name": _script_name(path), **json.loads(json.dumps(SCRIPT_DEFAULTS))}
        if directives.get("cooperative") or "rollout-cmd" in directives \
                or "train-cmd" in directives:
            directives["cooperative"] = text    # the body, for the roles without a line
        merged = apply_options(base, _absolute_workdir(directives))
    job_launch = merged.get("launch")
    if isinstance(job_launch, dict) and environ is not None and "env" not in job_launch:
        job_launch["env"] = launch.exportable(environ)
    spec_text = to_toml(merged)
    return spec_text, parse_job(spec_text, str(path))


def _absolute_workdir(options: Mapping[str, Any]) -> Mapping[str, Any]:
    workdir = options.get("workdir")
    if isinstance(workdir, str) and workdir and not workdir.startswith("/"):
        return {**options, "workdir": os.path.abspath(workdir)}
    return options
