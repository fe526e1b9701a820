"""A parsed job spec as JSON and back: how weaved stores the typed spec it parsed once,
at submission (``daemon/store.py``, column ``jobs.spec_json``).

The JSON holds :class:`~weave_slurm.config.job.JobSpec`'s fields as they are (nested
specs as objects, enums as their values, tuples as arrays); reading it rebuilds the
same frozen value, driven by the fields' type hints, and validates nothing again: the
spec was checked when it was parsed. A field the JSON lacks (a row an older weaved
wrote) takes its default. Decoded specs are shared (frozen values): a row read again
costs a dictionary look-up.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from enum import Enum
from typing import Any

from weave_slurm.config.job import JobSpec


def spec_to_json(spec: JobSpec) -> str:
    """``spec``'s fields as JSON (sorted keys: the same spec is the same text)."""
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


@functools.lru_cache(maxsize=4096)
def spec_from_json(text: str) -> JobSpec:
    """The spec :func:`spec_to_json` wrote."""
    spec: JobSpec = _dataclass(JobSpec, json.loads(text))
    return spec


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _dataclass(cls: type[Any], raw: dict[str, Any]) -> Any:
    hints = _hints(cls)
    return cls(**{f.name: _decode(hints[f.name], raw[f.name])
                  for f in dataclasses.fields(cls) if f.init and f.name in raw})


def _decode(hint: Any, value: Any) -> Any:
    """``value`` (JSON) as a value of type ``hint``."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        # X | None: an X; a union of scalars and tuples (``[options]``): arrays as tuples
        return _decode(kinds[0], value) if len(kinds) == 1 else _frozen(value)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
    if dataclasses.is_dataclass(hint):
        return _dataclass(typing.cast(type, hint), value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    return value


def _frozen(value: Any) -> Any:
    """JSON arrays as tuples, all the way down."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value
