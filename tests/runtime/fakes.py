"""Small fakes the runtime's unit tests share (no torch, no node daemon)."""

from __future__ import annotations

from typing import Any

from weave_slurm.node.index import JobRef
from weave_slurm.runtime.group import NodeRef


class FakeTransfer:
    """A weight transfer that records each copy and moves nothing."""

    def __init__(self) -> None:
        self.copies: list[tuple[str, str, tuple[str, ...]]] = []

    def copy(self, src: NodeRef, dsts: Any, job: JobRef, name: str,
             as_name: str | None = None) -> tuple[int, int]:
        self.copies.append((name, src.name, tuple(d.name for d in dsts)))
        return 0, 0

    def forget(self, job: JobRef) -> None:
        pass

    def close(self) -> None:
        pass
