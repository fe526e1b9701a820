"""Slurm hostlist expressions: ``h20-[0-3,7],h800-1`` <-> node names."""

from __future__ import annotations

import re

from weave_slurm.errors import ConfigError

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


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
