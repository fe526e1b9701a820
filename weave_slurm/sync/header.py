"""The wire header of one stage-1 piece, and the receiver's reply codes.

Every piece that crosses the slow link is preceded by a small ``int64`` tensor: a
magic number, a hash of the job id, the weight version, the delta base version, the
piece index, the encoding, the payload length and two CRC32 checksums (of the payload
as sent and of the piece after reconstruction, so a delta that decodes to the wrong
bytes is caught too). The receiver answers every piece with a one-element status.
"""

from __future__ import annotations

import enum
import hashlib
import zlib
from dataclasses import dataclass

import torch

from weave_slurm.sync.sync_errors import SyncError

MAGIC = 0x57EA7E5C
HEADER_WORDS = 9
NO_BASE = -1


class SyncMode(enum.IntEnum):
    """How a piece's payload is encoded (and the sync's requested mode)."""

    FULL = 0
    DELTA = 1


class Status(enum.IntEnum):
    """A receiver's answer to one piece; larger codes win when ranks combine statuses."""

    OK = 0
    NEED_FULL = 1  # delta base is not what the receiver holds: send the full piece
    RESEND = 2  # checksum mismatch: send again (once)
    STALE = 3  # version <= the last applied version of this job: refused
    WRONG_JOB = 4  # header names another job: refused
    FAILED = 5  # a peer gave up (corrupt after retry, or an error on its side)


def job_hash(job_id: str) -> int:
    """A stable 63-bit hash of the job id (fits a signed int64 header word)."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def crc32(buf: torch.Tensor) -> int:
    """CRC32 of a tensor's raw bytes (copied to host first if it lives on a GPU)."""
    flat = buf.detach().reshape(-1).view(torch.uint8)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return zlib.crc32(flat.contiguous().numpy().data) & 0xFFFF_FFFF


@dataclass(frozen=True)
class PieceHeader:
    """Metadata sent ahead of one piece's payload."""

    job: int
    version: int
    base_version: int
    piece: int
    mode: SyncMode
    payload_nbytes: int
    payload_crc: int
    piece_crc: int

    def to_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        words = [MAGIC, self.job, self.version, self.base_version, self.piece,
                 int(self.mode), self.payload_nbytes, self.payload_crc, self.piece_crc]
        return torch.tensor(words, dtype=torch.int64, device=device)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> PieceHeader:
        words = [int(w) for w in t.cpu().tolist()]
        if len(words) != HEADER_WORDS or words[0] != MAGIC:
            raise SyncError(f"sync header: bad magic or length {words[:2]!r}; peer speaks "
                            "another protocol or the stream is out of step")
        try:
            mode = SyncMode(words[5])
        except ValueError as exc:
            raise SyncError(f"sync header: unknown mode {words[5]!r}; valid: "
                            f"{[m.value for m in SyncMode]}") from exc
        return cls(words[1], words[2], words[3], words[4], mode, words[6], words[7], words[8])


def empty_header(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.zeros(HEADER_WORDS, dtype=torch.int64, device=device)
