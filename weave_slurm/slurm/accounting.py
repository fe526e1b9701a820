"""Limits and shares from a Slurm cluster's accounting (slurmdbd), read with sacctmgr.

A site that keeps its users' limits in Slurm's associations and QOS sets ``[limits]
from_slurm = true``: weaved reads them with ``sacctmgr -P -n show assoc`` and ``show
qos`` (:func:`read_accounting`) at its start and every ``limits.slurm_refresh_s``, and
applies them beside the site file's own tables (``daemon/accounting_limits.py``; the
words of each limit are Slurm's, docs/fairshare.md).

What is read, per association (``account``, ``user``; an account's own has no user):
``Fairshare`` (its share), ``MaxJobs`` and ``MaxSubmitJobs`` (what one user may run, and
have pending or running, in that account; an account's values are its users' defaults,
which sacctmgr shows on each user's line), ``GrpJobs`` and ``GrpSubmitJobs`` (all jobs of
the account), its QOS list and default QOS; per QOS: ``MaxJobsPerUser``,
``MaxSubmitJobsPerUser``, ``MaxJobsPerAccount``, ``MaxSubmitJobsPerAccount``. Partition
associations are left out: a weave job spans both pools' partitions. Trackable-resource
limits (``GrpTRES``, ``MaxTRESPerUser``) and time limits are not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.command_runner import CommandRunner

#: sacctmgr's format fields, in the order parsed (``-P``: '|' separated, ``-n``: no header).
ASSOC_FIELDS = ("Account", "User", "Partition", "Share", "MaxJobs", "MaxSubmit", "GrpJobs",
                "GrpSubmit", "QOS", "DefaultQOS")
QOS_FIELDS = ("Name", "MaxJobsPU", "MaxSubmitPU", "MaxJobsPA", "MaxSubmitPA")
#: The QOS a job gets where neither it nor its association names one (Slurm's default).
DEFAULT_QOS = "normal"


@dataclass(frozen=True, slots=True)
class Association:
    """One (account, user) association; ``user`` None: the account's own."""

    account: str
    user: str | None
    share: float | None = None       # Fairshare (None: 'parent', or not set)
    max_jobs: int | None = None      # MaxJobs: one user's jobs running in the account
    max_submit: int | None = None    # MaxSubmitJobs: ... pending or running
    grp_jobs: int | None = None      # GrpJobs: all the account's jobs running
    grp_submit: int | None = None    # GrpSubmitJobs: ... pending or running
    qos: tuple[str, ...] = ()
    default_qos: str | None = None


@dataclass(frozen=True, slots=True)
class Qos:
    """One QOS's per-user and per-account job limits (None: none)."""

    name: str
    max_jobs_pu: int | None = None      # MaxJobsPerUser
    max_submit_pu: int | None = None    # MaxSubmitJobsPerUser
    max_jobs_pa: int | None = None      # MaxJobsPerAccount
    max_submit_pa: int | None = None    # MaxSubmitJobsPerAccount


@dataclass(frozen=True)
class Accounting:
    """What one read of the cluster's accounting found."""

    cluster: str
    associations: Mapping[tuple[str, str | None], Association]
    qos: Mapping[str, Qos]

    def association(self, user: str, account: str) -> Association | None:
        """The user's association with ``account`` (None: it has none: Slurm refuses
        such a job, 'Invalid account or account/partition combination specified')."""
        return self.associations.get((account, user))

    def account_association(self, account: str) -> Association | None:
        return self.associations.get((account, None))

    def qos_of(self, user: str, account: str, asked: str | None) -> Qos | None:
        """The QOS a job of ``user`` in ``account`` runs under: the one it asked for,
        else its association's default, else ``normal`` (None: no such QOS)."""
        assoc = self.association(user, account)
        name = asked or (assoc.default_qos if assoc else None) or DEFAULT_QOS
        return self.qos.get(name)

    def shares(self) -> tuple[dict[str, float], dict[str, float]]:
        """(user -> share, account -> share) for fair share: a user's share is that of
        its association with the largest one, where it has several accounts."""
        users: dict[str, float] = {}
        accounts: dict[str, float] = {}
        for (account, user), a in self.associations.items():
            if a.share is None:
                continue
            if user is None:
                accounts[account] = a.share
            else:
                users[user] = max(users.get(user, 0.0), a.share)
        return users, accounts


def read_accounting(runner: CommandRunner, env: Mapping[str, str] | None = None,
                    cluster: str | None = None, timeout_s: float = 30.0) -> Accounting:
    """Read the associations and QOS of ``cluster`` (None: slurm.conf's ClusterName).
    Raises :class:`~weave_slurm.slurm.command_runner.SlurmCommandError` when a command
    fails (no slurmdbd, no accounting plugin) and ConfigError on output it cannot read."""
    if cluster is None:
        conf = runner.run(["scontrol", "show", "config"], timeout_s=timeout_s, env=env)
        cluster = cluster_name(conf.stdout)
    assoc = runner.run(["sacctmgr", "-P", "-n", "show", "assoc", "where",
                        f"cluster={cluster}", f"format={','.join(ASSOC_FIELDS)}"],
                       timeout_s=timeout_s, env=env)
    qos = runner.run(["sacctmgr", "-P", "-n", "show", "qos",
                      f"format={','.join(QOS_FIELDS)}"], timeout_s=timeout_s, env=env)
    return Accounting(cluster, parse_associations(assoc.stdout), parse_qos(qos.stdout))


def cluster_name(config: str) -> str:
    """ClusterName from ``scontrol show config``'s ``Key = value`` lines."""
    for line in config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ClusterName" and value.strip():
            return value.strip()
    raise ConfigError("scontrol show config: no ClusterName (needed to read the "
                      "cluster's associations from Slurm's accounting)")


def parse_associations(text: str) -> dict[tuple[str, str | None], Association]:
    """``sacctmgr -P -n show assoc format=<ASSOC_FIELDS>`` -> (account, user) -> row."""
    out: dict[tuple[str, str | None], Association] = {}
    for cells in _rows(text, ASSOC_FIELDS, "show assoc"):
        account, user, partition, share, *limits, qos, default = cells
        if partition:
            continue   # a partition's own association (module doc)
        max_jobs, max_submit, grp_jobs, grp_submit = (_count(v, "show assoc") for v in limits)
        out[(account, user or None)] = Association(
            account, user or None, _share(share), max_jobs, max_submit, grp_jobs, grp_submit,
            tuple(q for q in qos.split(",") if q), default or None)
    return out


def parse_qos(text: str) -> dict[str, Qos]:
    """``sacctmgr -P -n show qos format=<QOS_FIELDS>`` -> name -> row."""
    out = {}
    for name, *limits in _rows(text, QOS_FIELDS, "show qos"):
        jobs_pu, submit_pu, jobs_pa, submit_pa = (_count(v, "show qos") for v in limits)
        out[name] = Qos(name, jobs_pu, submit_pu, jobs_pa, submit_pa)
    return out


def _rows(text: str, fields: Sequence[str], what: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split("|")
        if cells and cells[-1] == "" and len(cells) == len(fields) + 1:
            cells.pop()   # -p (not -P) ends each line with '|'
        if len(cells) != len(fields):
            raise ConfigError(f"sacctmgr {what}: a line of {len(cells)} fields, expected "
                              f"{len(fields)} ({','.join(fields)}): {line[:120]!r}")
        rows.append([c.strip() for c in cells])
    return rows


def _count(value: str, what: str) -> int | None:
    if not value:
        return None
    if not value.isdigit():
        raise ConfigError(f"sacctmgr {what}: {value!r} is not a job count")
    return int(value)


def _share(value: str) -> float | None:
    """A Fairshare value: a number, or 'parent' (None: the parent's share is used)."""
    if not value or value.lower() == "parent":
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"sacctmgr show assoc: share {value!r} is not a number") from None
