"""Reading Slurm's associations and QOS (slurm/accounting.py) from sacctmgr's output:
the lines below are what Slurm 22.05's sacctmgr printed against a real slurmdbd (the live
test, tests/slurm/test_accounting_live.py, reads them from one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.slurm.accounting import (
    Association,
    Qos,
    cluster_name,
    parse_associations,
    parse_qos,
    read_accounting,
)
from weave_slurm.slurm.command_runner import CommandResult

ASSOC = """\
root|||1|||||normal|
root|root||1|||||normal|
physics|||3|4|10|||normal|
physics|alice||2|2|5|||normal|
physics|bob||1|4|10|||normal,small|small
bio|||parent|4|10|7|9|normal|
bio|alice|p|5|4|10|||normal|
bio|carol||1|4|10|||normal|
"""
QOS = "normal||||\nsmall|3|6|8|12\n"


def test_associations_as_sacctmgr_prints_them() -> None:
    rows = parse_associations(ASSOC)
    assert rows[("physics", "alice")] == Association("physics", "alice", 2.0, 2, 5, None,
                                                     None, ("normal",), None)
    assert rows[("physics", "bob")].qos == ("normal", "small")
    assert rows[("physics", "bob")].default_qos == "small"
    bio = rows[("bio", None)]
    assert bio.share is None and (bio.grp_jobs, bio.grp_submit) == (7, 9)   # 'parent'
    assert ("bio", "alice") not in rows          # a partition's association: left out
    assert parse_qos(QOS) == {"normal": Qos("normal"), "small": Qos("small", 3, 6, 8, 12)}


def test_the_job_qos_and_the_shares() -> None:
    class Runner:
        def __init__(self) -> None:
            self.argvs: list[list[str]] = []

        def run(self, argv: Sequence[str], *, timeout_s: float = 30.0,
                env: Mapping[str, str] | None = None) -> CommandResult:
            self.argvs.append(list(argv))
            out = {"scontrol": "ClusterName             = wtest\nSlurmUser = root\n",
                   "assoc": ASSOC, "qos": QOS}
            key = "scontrol" if argv[0] == "scontrol" else argv[4]
            return CommandResult(tuple(argv), 0, out[key], "")

    runner = Runner()
    acct = read_accounting(runner)   # type: ignore[arg-type]
    assert acct.cluster == "wtest" and "cluster=wtest" in runner.argvs[1]
    assert acct.qos_of("bob", "physics", None) == Qos("small", 3, 6, 8, 12)   # its default
    q = acct.qos_of("alice", "physics", None)
    assert q is not None and q.name == "normal"
    assert acct.qos_of("alice", "physics", "gold") is None                   # no such QOS
    users, accounts = acct.shares()
    assert users["alice"] == 2.0 and accounts == {"root": 1.0, "physics": 3.0}


def test_output_it_cannot_read_is_an_error_naming_the_command() -> None:
    with pytest.raises(ConfigError, match="sacctmgr show assoc: a line of 3 fields"):
        parse_associations("a|b|c\n")
    with pytest.raises(ConfigError, match="sacctmgr show qos: 'x' is not a job count"):
        parse_qos("normal|x|||\n")
    with pytest.raises(ConfigError, match="no ClusterName"):
        cluster_name("SlurmUser = root\n")
