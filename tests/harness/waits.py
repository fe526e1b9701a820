"""Waiting in tests: one polling loop, which either fails naming what it waited for and
what it last saw (:func:`wait_for`) or hands the last value to the test's own
assertion (:func:`settle`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar, cast

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout_s: float, what: str = "a condition", *,
             interval_s: float = 0.05, until: Callable[[T], object] = bool,
             ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``probe`` every ``interval_s`` until ``until(value)`` holds (by default: the
    value is truthy) and return that value; after ``timeout_s``, AssertionError naming
    ``what`` and the last value seen. An exception of an ``ignore`` type means "not
    yet" (and is what was seen)."""
    held, last = _poll(probe, timeout_s, interval_s, until, ignore)
    if not held:
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; "
                             f"last seen: {last!r}")
    return cast(T, last)


def settle(probe: Callable[[], T], timeout_s: float, *, interval_s: float = 0.05,
           until: Callable[[T], object] = bool) -> T:
    """:func:`wait_for` that does not fail: after ``timeout_s`` it returns the last value,
    for a wait that the test follows with its own assertion (or none)."""
    return cast(T, _poll(probe, timeout_s, interval_s, until, ())[1])


def _poll(probe: Callable[[], T], timeout_s: float, interval_s: float,
          until: Callable[[T], object],
          ignore: tuple[type[BaseException], ...]) -> tuple[bool, object]:
    """(whether ``until`` held, the last value or ignored exception)."""
    end = time.monotonic() + timeout_s
    while True:
        last: object
        try:
            last = value = probe()
        except ignore as exc:
            last = exc
        else:
            if until(value):
                return True, value
        if time.monotonic() >= end:
            return False, last
        time.sleep(interval_s)
