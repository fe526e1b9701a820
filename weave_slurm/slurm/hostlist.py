"""Slurm hostlist expressions: ``h20-[0-3,7],h800-1`` <-> node names."""

from __future__ import annotations

import re
from collections.abc import Iterable

from weave_slurm.errors import ConfigError

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?\Z")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_one(item: str, expr: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.find("]", start)
    if end < 0:
        raise ConfigError(f"hostlist {expr!r}: unclosed '[' in {item!r}")
    head, body, tail = item[:start], item[start + 1:end], item[end + 1:]
    out = []
    for rng in body.split(","):
        m = _RANGE_RE.match(rng.strip())
        if not m:
            raise ConfigError(f"hostlist {expr!r}: bad range {rng!r}; expected N or N-M")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        width = len(lo_s) if lo_s.startswith("0") else 0
        for i in range(int(lo_s), int(hi_s) + 1):
            out += [head + str(i).zfill(width) + rest for rest in _expand_one(tail, expr)]
    return out


def expand(expr: str) -> tuple[str, ...]:
    """All node names of ``expr`` in order (``"(null)"`` and ``""`` mean none)."""
    if not expr or expr in ("(null)", "None"):
        return ()
    return tuple(name for item in _split_top(expr) for name in _expand_one(item, expr))


_NAME_RE = re.compile(r"^(.*?)(\d+)\Z")


def compress(names: Iterable[str]) -> str:
    """Node names as Slurm prints them: ``h20-0,h20-1,h20-3,h800-0`` -> ``h20-[0-1,3],h800-0``.

    Names are grouped by their prefix before a trailing number (in the order each prefix
    first appears); numbers keep their zero padding (``n[01-02]``), and a run of
    consecutive numbers of one width becomes a range. The inverse of :func:`expand`.
    """
    split = [(name, _NAME_RE.match(name)) for name in names]
    padded = {(m.group(1), len(m.group(2))) for _, m in split    # prefixes with n01, n02...
              if m is not None and m.group(2).startswith("0") and len(m.group(2)) > 1}
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    for name, m in split:
        if m is None:                       # no trailing number: shown as it is
            if name not in order:
                order.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        key = (prefix, len(digits) if (prefix, len(digits)) in padded else 0)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    return ",".join(item if isinstance(item, str) else _ranges(item, groups[item])
                    for item in order)


def _ranges(key: tuple[str, int], numbers: list[int]) -> str:
    prefix, width = key
    nums = sorted(set(numbers))
    if len(nums) == 1:
        return f"{prefix}{str(nums[0]).zfill(width)}"
    spans: list[str] = []
    lo = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        spans.append(str(lo).zfill(width) if lo == prev
                     else f"{str(lo).zfill(width)}-{str(prev).zfill(width)}")
        if n is not None:
            lo = prev = n
    return f"{prefix}[{','.join(spans)}]"
