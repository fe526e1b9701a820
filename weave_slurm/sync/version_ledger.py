"""The receiver's record of which weight version of each job it holds."""

from __future__ import annotations

from weave_slurm.errors import VersionMismatch


class VersionLedger:
    """Last applied version per job, plus the highest version ever seen.

    ``applied(job)`` is the version the local weights hold (``None`` when unknown or
    torn by a failed sync, so the next sync must send full pieces); a version at or
    below ``high_water(job)`` is stale or a duplicate and is refused.
    """

    def __init__(self) -> None:
        self._applied: dict[str, int] = {}
        self._high: dict[str, int] = {}

    def applied(self, job: str) -> int | None:
        return self._applied.get(job)

    def high_water(self, job: str) -> int | None:
        return self._high.get(job)

    def is_fresh(self, job: str, version: int) -> bool:
        high = self._high.get(job)
        return high is None or version > high

    def check_fresh(self, job: str, version: int) -> None:
        if not self.is_fresh(job, version):
            raise VersionMismatch(
                f"job {job!r}: weight version {version} refused, already at "
                f"{self._high[job]} (stale or duplicate; versions must increase)")

    def commit(self, job: str, version: int) -> None:
        self.check_fresh(job, version)
        self._applied[job] = version
        self._high[job] = version

    def forget(self, job: str) -> None:
        """The owner restored an older checkpoint on purpose: versions start over.

        Only the group runtime calls this, as part of a recovery it decided on; a
        version that merely arrives late is still refused.
        """
        self._applied.pop(job, None)
        self._high.pop(job, None)

    def invalidate(self, job: str) -> None:
        """Local weights are torn (a sync failed half-way): demand full pieces next time."""
        self._applied.pop(job, None)
