"""Times as sacct's ``-S``/``-E`` take them (a subset), in local time.

Valid forms::

    YYYY-MM-DD[THH:MM[:SS]]     2026-12-01, 2026-12-01T13:30, 2026-12-01T13:30:05
    HH:MM[:SS]                  today at that time
    now[{+|-}N[unit]]           now, now-1hour, now-90minutes, now+2days (unit: seconds
                                (the default), minutes, hours, days, weeks; or s, min, h,
                                d, w; singular or plural)
    today, midnight             today at 00:00:00
    noon                        today at 12:00:00
"""

from __future__ import annotations

import re
import time

from weave_slurm.errors import ConfigError

FORMS = ("YYYY-MM-DD[THH:MM[:SS]]", "HH:MM[:SS]", "now[{+|-}N[seconds|minutes|hours|days|"
         "weeks]]", "today", "midnight", "noon")
_UNITS = {"": 1, "s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600,
          "hour": 3600, "d": 86400, "day": 86400, "w": 604800, "week": 604800}
_NOW = re.compile(r"^now(?:([+-])(\d+)([a-z]*))?\Z")
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2}))?)?\Z")
_CLOCK = re.compile(r"^(\d{2}):(\d{2})(?::(\d{2}))?\Z")


def parse_time(text: str, now: float, flag: str = "") -> float:
    """Seconds since the epoch for ``text`` (``now``: the time 'now' means)."""
    word = text.strip().lower()
    m = _NOW.match(word)
    if m:
        if m.group(1) is None:
            return now
        unit = m.group(3)
        scale = _UNITS.get(unit, _UNITS.get(unit[:-1], 0) if unit.endswith("s") else 0)
        if not scale:
            raise _bad(text, flag, f"unit {unit!r} is unknown; valid: seconds, minutes, "
                       "hours, days, weeks")
        delta = int(m.group(2)) * scale
        return now + delta if m.group(1) == "+" else now - delta
    day = time.localtime(now)
    if word in ("today", "midnight", "noon"):
        return _local(day.tm_year, day.tm_mon, day.tm_mday, 12 if word == "noon" else 0, 0, 0)
    m = _DATE.match(text.strip())
    if m:
        year, mon, mday, hour, minute, sec = (int(g) if g else 0 for g in m.groups())
        return _checked(text, flag, year, mon, mday, hour, minute, sec)
    m = _CLOCK.match(word)
    if m:
        hour, minute, sec = (int(g) if g else 0 for g in m.groups())
        return _checked(text, flag, day.tm_year, day.tm_mon, day.tm_mday, hour, minute, sec)
    raise _bad(text, flag, f"valid forms: {', '.join(FORMS)}")


def _checked(text: str, flag: str, year: int, mon: int, mday: int, hour: int, minute: int,
             sec: int) -> float:
    stamp = f"{year:04d}-{mon:02d}-{mday:02d}T{hour:02d}:{minute:02d}:{sec:02d}"
    try:
        time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")   # a real date and time of day
    except ValueError:
        raise _bad(text, flag, "no such date or time of day") from None
    return _local(year, mon, mday, hour, minute, sec)


def _local(year: int, mon: int, mday: int, hour: int, minute: int, sec: int) -> float:
    return time.mktime((year, mon, mday, hour, minute, sec, 0, 0, -1))


def _bad(text: str, flag: str, why: str) -> ConfigError:
    return ConfigError(f"{flag + ': ' if flag else ''}invalid time {text!r}; {why}")
