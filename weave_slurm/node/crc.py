"""A segment's CRC32: how a copy proves it holds its source's bytes (no torch at import).

A copied segment carries its source's CRC32 in its index under :data:`CRC_KEY`; whoever
reads it (a rollout reading a weights buffer, the copy itself after writing) compares.
"""

from __future__ import annotations

import zlib
from typing import Any

CRC_KEY = "crc32"


def storage_crc32(storage: Any) -> int:
    """CRC32 of a mapped segment's bytes (a ``torch.UntypedStorage``)."""
    import torch

    data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    return zlib.crc32(data.data) & 0xFFFFFFFF
