"""Fixtures of the CLI tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its level and handlers put back after the test (the handlers a
    test added are removed and closed)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield root
    for h in root.handlers:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)
