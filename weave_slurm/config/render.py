"""Job specs written out: the TOML text of a job spec, from typed values.

The way back from :func:`weave_slurm.config.job.parse_job` for the keys a caller sets:
what :func:`job_spec_toml` writes always parses, to the values it was given
(round-trip tested). A key given as ``None`` is left out, so the parser's own default
applies. The other defaults describe one job, the *small reference job* that
``weave demo``, the benchmarks and the tests submit: a 0.5 B model, 8 prompts x 2
samples of at most 256 tokens, 1 + 1 GPUs (one rank, one engine), with 10 s phases
and 1 GiB of warm state per pool declared (what placement plans with), and an SLO of
3.0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from weave_slurm.errors import ConfigError

#: A scalar: what every key of a spec is (but ``pythonpath``), and ``[options]`` holds.
Scalar = str | int | float | bool
#: An ``[options]`` value: a scalar, a list of scalars or a nested table of those
#: (written as a ``[options.<key>]`` table).
OptionInput = Scalar | Sequence[Scalar] | Mapping[str, "OptionInput"]
#: A value of a spec's table: a scalar, a list of scalars (``pythonpath``) or a table.
Value = OptionInput

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+\Z")


def job_spec_toml(name: str, *, slo: float | None = 3.0,
                  entry: str | None = "builtin:grpo-toy",
                  iterations: int | None = None, seed: int | None = None,
                  staleness: int | None = None, user: str | None = None,
                  params_b: float = 0.5, prompts_per_step: int = 8,
                  samples_per_prompt: int = 2, max_response_tokens: int = 256,
                  rollout_gpus: int = 1, train_gpus: int = 1, engine_gpus: int | None = None,
                  rollout_s: float | None = 10.0, train_s: float | None = 10.0,
                  rollout_state_gib: float | None = 1.0, train_state_gib: float | None = 1.0,
                  options: Mapping[str, OptionInput] | None = None,
                  workdir: str | None = None,
                  python: str | None = None, pythonpath: Sequence[str] | None = None) -> str:
    """The spec TOML of one job: top-level keys, then ``[model]``, ``[rollout]``,
    ``[gpus]``, ``[profile]`` (if any of its keys is given) and ``[options]`` (if any;
    a nested table as ``[options.<key>]``).
    ``workdir``, ``python`` and ``pythonpath`` name the user's own code (left out: the
    defaults)."""
    return toml_tables({
        "": {"name": name, "user": user, "slo": slo, "entry": entry,
             "iterations": iterations, "seed": seed, "staleness": staleness,
             "workdir": workdir, "python": python,
             "pythonpath": None if pythonpath is None else list(pythonpath)},
        "model": {"params_b": params_b},
        "rollout": {"prompts_per_step": prompts_per_step,
                    "samples_per_prompt": samples_per_prompt,
                    "max_response_tokens": max_response_tokens},
        "gpus": {"rollout": rollout_gpus, "train": train_gpus, "engine": engine_gpus},
        "profile": {"rollout_s": rollout_s, "train_s": train_s,
                    "rollout_state_gib": rollout_state_gib,
                    "train_state_gib": train_state_gib},
        "options": dict(options or {}),
    })


def toml_tables(tables: Mapping[str, Mapping[str, Value | None]]) -> str:
    """TOML for tables of scalars, lists of scalars and nested tables (``""`` is the top
    level); ``None`` values are left out, and so is a table left empty. A nested table
    follows its parent's keys as ``[parent.key]``; an empty one is refused (the parser
    refuses it too)."""
    lines: list[str] = []
    for table, values in tables.items():
        _table(lines, (table,) if table else (), values)
    return "".join(line + "\n" for line in lines)


def _table(lines: list[str], path: tuple[str, ...], values: Mapping[str, Value | None]) -> None:
    where = ".".join(path)
    given = [(key, value) for key, value in values.items() if value is not None]
    plain = [(key, value) for key, value in given if not isinstance(value, Mapping)]
    if path and plain:
        lines.append("[" + ".".join(_key(part) for part in path) + "]")
    lines += [f"{_key(key)} = {_scalar(value, f'{where}.{key}' if where else key)}"
              for key, value in plain]
    for key, value in given:
        if isinstance(value, Mapping):
            if not value:
                raise ConfigError(f"key '{where}.{key}' = {{}}: cannot write an empty table "
                                  "to a job spec; leave it out")
            _table(lines, (*path, key), value)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _scalar(key, key)


def _scalar(value: object, where: str) -> str:
    """One TOML value: a boolean, an integer, a float, a basic string or a list of
    those."""
    if isinstance(value, list | tuple) and all(isinstance(v, Scalar) for v in value):
        return "[" + ", ".join(_scalar(v, where) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_escape(c) for c in value) + '"'
    raise ConfigError(f"key '{where}' = {value!r}: cannot write a {type(value).__name__} "
                      "to a job spec; expected a string, number, boolean, a list of those "
                      "or a table")


def _escape(char: str) -> str:
    """A character of a TOML basic string: quote, backslash and controls escaped."""
    if char in '"\\':
        return "\\" + char
    if char < " " or char == "\x7f":
        return f"\\u{ord(char):04x}"
    return char
