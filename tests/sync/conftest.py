"""Fixtures for the sync tests: weight versions written to /dev/shm for rank processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

VersionsFactory = Callable[[int, list[float]], tuple[str, ...]]


@pytest.fixture
def make_versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VersionsFactory]:
    """``make_versions(nbytes, fractions)``: files of bf16 weights; file ``i+1`` changes
    ``fractions[i]`` of file ``i``'s elements (with NaN, -0.0, inf among the new values)."""
    import shutil
    import tempfile

    import torch

    root = Path(tempfile.mkdtemp(prefix="weave-sync-test-", dir="/dev/shm"))

    def make(nbytes: int, fractions: list[float]) -> tuple[str, ...]:
        g = torch.Generator().manual_seed(nbytes)
        w = torch.randn(nbytes // 2, generator=g).bfloat16()
        w[:4] = torch.tensor([float("nan"), -0.0, float("inf"), 1e-40]).bfloat16()
        files = []
        for i, frac in enumerate([1.0, *fractions]):
            if i:
                w = w.clone()
                idx = torch.randperm(w.numel(), generator=g)[:int(frac * w.numel())]
                w[idx] = torch.randn(idx.numel(), generator=g).bfloat16()
                w[idx[:2]] = torch.tensor([-0.0, float("nan")]).bfloat16()[:idx[:2].numel()]
            path = root / f"v{i}"
            w.view(torch.uint8).numpy().tofile(path)
            files.append(str(path))
        return tuple(files)

    yield make
    shutil.rmtree(root, ignore_errors=True)
