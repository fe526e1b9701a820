"""Packaged data files (reference traces and profiles; see README.md for attribution)."""

from __future__ import annotations

from pathlib import Path

REFERENCE_DIR_NAME = "weave-reference"


def reference_dir() -> Path:
    """Directory holding the packaged copies of the Weave / RollMux reference data."""
    return Path(__file__).resolve().parent / REFERENCE_DIR_NAME


def reference_file(name: str) -> Path:
    """Path of one packaged reference file, e.g. ``reference_file("wild.trace")``."""
    return reference_dir() / name
