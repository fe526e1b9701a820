"""Strict reading of TOML tables: typed getters that name the file and key on error.

Every config and spec loader goes through :class:`TableReader` so that unknown keys,
wrong types and out-of-range values all produce the same kind of one-line message::

    configs/site.toml: key 'pools.rollout.gpus_per_node' = -8: must be > 0
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from weave_slurm.errors import ConfigError

T = TypeVar("T")

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a table"}


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; any problem becomes a one-line ConfigError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a TOML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_toml(text, str(path))


def parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None


class TableReader:
    """Reads one TOML table; call :meth:`done` at the end to reject unknown keys."""

    def __init__(self, data: Any, source: str, prefix: str = "") -> None:
        if not isinstance(data, dict):
            where = f"key '{prefix}'" if prefix else "top level"
            raise ConfigError(f"{source}: {where} must be a table, got {_show(data)}")
        self._data: dict[str, Any] = data
        self._source = source
        self._prefix = prefix
        self._seen: set[str] = set()

    @property
    def source(self) -> str:
        return self._source

    def key(self, name: str) -> str:
        return f"{self._prefix}.{name}" if self._prefix else name

    def fail(self, name: str, value: Any, why: str) -> ConfigError:
        return ConfigError(f"{self._source}: key '{self.key(name)}' = {_show(value)}: {why}")

    def has(self, name: str) -> bool:
        return name in self._data

    def raw(self, name: str) -> Any:
        """The unvalidated value of a key (for keys with a special-case message)."""
        return self._data.get(name)

    def names(self) -> list[str]:
        """Every key of the table (for tables whose keys are names: shares by user)."""
        return list(self._data)

    def is_table(self, name: str) -> bool:
        return isinstance(self._data.get(name), dict)

    def _get(self, name: str, kind: type[T], default: T | None, required: bool) -> T | None:
        self._seen.add(name)
        if name not in self._data:
            if required:
                raise ConfigError(f"{self._source}: missing required key '{self.key(name)}'")
            return default
        value = self._data[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise self.fail(name, value, f"must be {_TYPE_NAMES.get(kind, kind.__name__)}")
        return value

    def string(self, name: str, default: str | None = None, *,
               choices: Iterable[str] | None = None) -> str:
        value = self._get(name, str, default, default is None)
        assert value is not None  # guaranteed by required=default is None
        if choices is not None:
            valid = sorted(choices)
            if value not in valid:
                raise self.fail(name, value, f"valid choices: {', '.join(valid)}")
        if not value.strip():
            raise self.fail(name, value, "must not be empty")
        return value

    def opt_string(self, name: str) -> str | None:
        return self._get(name, str, None, False)

    def number(self, name: str, default: float | None = None, *, gt: float | None = None,
               ge: float | None = None, le: float | None = None) -> float:
        value = self._get(name, float, default, default is None)
        assert value is not None
        return self._check_range(name, value, gt, ge, le)

    def opt_number(self, name: str, *, gt: float | None = None, ge: float | None = None,
                   le: float | None = None) -> float | None:
        value = self._get(name, float, None, False)
        return None if value is None else self._check_range(name, value, gt, ge, le)

    def integer(self, name: str, default: int | None = None, *, gt: int | None = None,
                ge: int | None = None, le: int | None = None) -> int:
        value = self._get(name, int, default, default is None)
        assert value is not None
        return int(self._check_range(name, value, gt, ge, le))

    def opt_integer(self, name: str, *, gt: int | None = None, ge: int | None = None) -> int | None:
        value = self._get(name, int, None, False)
        return None if value is None else int(self._check_range(name, value, gt, ge, None))

    def boolean(self, name: str, default: bool) -> bool:
        value = self._get(name, bool, default, False)
        return bool(value)

    def number_list(self, name: str, *, gt: float | None = None) -> tuple[float, ...] | None:
        value = self._get(name, list, None, False)
        if value is None:
            return None
        out: list[float] = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise self.fail(name, value, "must be a list of numbers")
            out.append(self._check_range(name, float(item), gt, None, None))
        if not out:
            raise self.fail(name, value, "must not be empty")
        return tuple(out)

    def table(self, name: str, *, required: bool = True) -> TableReader | None:
        self._seen.add(name)
        if name not in self._data:
            if required:
                raise ConfigError(f"{self._source}: missing required table '[{self.key(name)}]'")
            return None
        return TableReader(self._data[name], self._source, self.key(name))

    def subtables(self, name: str) -> dict[str, TableReader]:
        """A table of tables (``[pools.rollout]``, ``[pools.train]``) as readers by name."""
        outer = self.table(name)
        assert outer is not None
        out: dict[str, TableReader] = {}
        for sub in list(outer._data):
            reader = outer.table(sub)
            assert reader is not None
            out[sub] = reader
        return out

    def _check_range(self, name: str, value: float, gt: float | None, ge: float | None,
                     le: float | None) -> float:
        if value != value:  # NaN
            raise self.fail(name, value, "must be a number, not NaN")
        if gt is not None and not value > gt:
            raise self.fail(name, value, f"must be > {_bound(gt)}")
        if ge is not None and not value >= ge:
            raise self.fail(name, value, f"must be >= {_bound(ge)}")
        if le is not None and not value <= le:
            raise self.fail(name, value, f"must be <= {_bound(le)}")
        if value in (float("inf"), float("-inf")):
            raise self.fail(name, value, "must be finite")
        return value

    def done(self) -> None:
        """Reject keys that no getter asked for (typos, stale options)."""
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            name = unknown[0]
            valid = ", ".join(sorted(self._seen)) or "(none)"
            raise ConfigError(
                f"{self._source}: unknown key '{self.key(name)}'; valid keys here: {valid}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bound(limit: float) -> str:
    """A range limit as written (an integer limit in full, not as 1.04858e+06)."""
    return str(limit) if isinstance(limit, int) else f"{limit:g}"
