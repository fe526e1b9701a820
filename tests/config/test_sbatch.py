"""config/sbatch.py: sbatch's --time formats, the #SBATCH options weave honours (each
spelling) and refuses, output patterns, and the spec's [slurm] table."""

from __future__ import annotations

import pytest

from weave_slurm.config.job import parse_job
from weave_slurm.config.render import job_spec_toml
from weave_slurm.config.sbatch import (
    HONOURED,
    JobSlurm,
    host_path,
    log_path,
    log_pattern,
    parse_time_min,
    refuse_over_site,
    sbatch_tokens,
    slurm_name,
)
from weave_slurm.config.site import SlurmConfig
from weave_slurm.errors import ConfigError, InfeasibleRequest


@pytest.mark.parametrize(("raw", "minutes"), [
    ("90", 90),                 # minutes
    ("5:00", 5),                # MM:SS
    ("5:01", 6),                # seconds round up to the next minute, as Slurm
    ("0:30", 1),
    ("1:30:00", 90),            # HH:MM:SS
    ("1:30:59", 91),
    ("2-12", 3600),             # D-HH
    ("1-02:03", 1563),          # D-HH:MM
    ("1-02:03:04", 1564),       # D-HH:MM:SS
    ("0-0:0:1", 1),
])
def test_sbatch_time_formats(raw: str, minutes: int) -> None:
    assert parse_time_min(raw) == minutes


@pytest.mark.parametrize("raw", ["0", "UNLIMITED", "infinite", "0:00"])
def test_zero_and_unlimited_mean_no_limit_of_its_own(raw: str) -> None:
    assert parse_time_min(raw) is None


@pytest.mark.parametrize("raw", ["1h", "", "1:2:3:4", "-5", "1-", "a-1", "1.5", "1-1:2:3:4",
                                 "1 0"])
def test_bad_times_are_refused_listing_the_formats(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"not one of M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"):
        parse_time_min(raw)


def test_a_time_over_a_year_is_refused() -> None:
    with pytest.raises(ConfigError, match="at most 525600"):
        parse_time_min("366-0")


@pytest.mark.parametrize(("words", "pairs"), [
    (["--account=physics"], [("account", "physics")]),
    (["--account", "physics"], [("account", "physics")]),
    (["-A", "physics"], [("account", "physics")]),
    (["-Aphysics"], [("account", "physics")]),
    (["--qos=high", "-q", "low"], [("qos", "high"), ("qos", "low")]),
    (["-t", "10", "--time=1:00:00", "--time", "2-0", "-t5"],
     [("time", "10"), ("time", "1:00:00"), ("time", "2-0"), ("time", "5")]),
    (["-o", "out.%j", "--output=o", "--output", "o2", "-oo3"],
     [("output", "out.%j"), ("output", "o"), ("output", "o2"), ("output", "o3")]),
    (["-e", "err", "--error=e2", "--error", "e3", "-ee4"],
     [("error", "err"), ("error", "e2"), ("error", "e3"), ("error", "e4")]),
    (["-J", "n", "-Jn2", "--job-name=n3", "--job-name", "n4"],
     [("job-name", "n"), ("job-name", "n2"), ("job-name", "n3"), ("job-name", "n4")]),
    (["-D", "/home/a", "--chdir=/home/b"], [("workdir", "/home/a"), ("workdir", "/home/b")]),
    ([], []),
])
def test_every_spelling_sbatch_accepts(words: list[str], pairs: list[tuple[str, str]]) -> None:
    assert sbatch_tokens(words, "s.sh:2") == pairs


@pytest.mark.parametrize(("words", "named"), [
    (["--partition=h20"], "'--partition'"),
    (["-p", "h20"], "'-p'"),
    (["-N", "2"], "'-N'"),
    (["--gres=gpu:8"], "'--gres'"),
    (["--exclusive"], "'--exclusive'"),
    (["-A", "x", "--mem", "10G"], "'--mem'"),
    (["physics"], "'physics'"),
])
def test_any_other_option_is_refused_in_one_line_listing_what_is_honoured(
        words: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        sbatch_tokens(words, "s.sh:2")
    msg = str(info.value)
    assert msg.startswith(f"s.sh:2: #SBATCH {named} is not honoured") and "\n" not in msg
    assert msg.endswith(f"honoured: {HONOURED}")
    assert HONOURED == ("--account/-A, --qos/-q, --time/-t, --output/-o, --error/-e, "
                        "--job-name/-J, --chdir/-D, --dependency/-d, --hold/-H, "
                        "--array/-a, --container")


def test_an_option_without_its_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"s.sh:2: #SBATCH --account needs a value"):
        sbatch_tokens(["--account"], "s.sh:2")
    with pytest.raises(ConfigError, match=r"#SBATCH -t needs a value"):
        sbatch_tokens(["-t"], "s.sh:2")


@pytest.mark.parametrize("raw", ["a b", "x;y", "", "a" * 65, "ph/ys"])
def test_bad_account_names_are_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="must be a Slurm name"):
        slurm_name(raw)


def test_output_patterns_expand_as_sbatch() -> None:
    def path(pattern: str, workdir: str | None = None) -> str:
        return log_path(pattern, job_id=42, user="alice", job_name="grpo", workdir=workdir)
    assert path("/home/alice/%x-%j.out") == "/home/alice/grpo-42.out"
    assert host_path(path("%u/%5j.%%j"), "n1") == "alice/00042.%j"
    assert path("logs/%j.err", "/w/") == "/w/logs/42.err"
    assert path("/abs/%j", "/w") == "/abs/42"
    assert path("%A_%a-%3a.out") == "42_4294967294-4294967294.out"   # not an array
    assert log_path("%A_%2a-%x.%%", job_id=45, user="u", job_name="n", array_job=42,
                    array_task=3) == "42_03-n.%%"
    later = path("%N/%%-%j.out", "/w")          # %N: the host that opens the file
    assert later == "/w/%N/%%-42.out" and host_path(later, "node-3.lan") == "/w/node-3/%-42.out"
    assert host_path(path("%%N"), "x") == "%N" and host_path("/a/%N", "%N") == "/a/%N"
    for bad in ("%Z.out", "out%", "a\nb", ""):
        with pytest.raises(ConfigError):
            log_pattern(bad)


def test_the_spec_slurm_table_is_read_and_checked() -> None:
    base = job_spec_toml("t")
    spec = parse_job(base + '\n[slurm]\naccount = "physics"\nqos = "high"\n'
                     'time_limit_min = 30\noutput = "/tmp/%j.out"\n', "t.toml")
    assert spec.slurm == JobSlurm("physics", "high", 30, "/tmp/%j.out", None)
    assert parse_job(base, "t.toml").slurm == JobSlurm()
    for table, match in (('account = "a b"', r"key 'slurm.account' = 'a b': must be a Slurm"),
                         ("time_limit_min = 0", r"key 'slurm.time_limit_min' = 0: must be "),
                         ('output = "%Z"', r"key 'slurm.output' = '%Z': unknown replacement"),
                         ('partition = "h20"', r"slurm.partition")):
        with pytest.raises(ConfigError, match=match):
            parse_job(base + f"\n[slurm]\n{table}\n", "t.toml")


def test_a_time_over_the_sites_limit_is_infeasible() -> None:
    refuse_over_site(JobSlurm(time_limit_min=90), SlurmConfig(time_limit_min=90), "j")
    refuse_over_site(JobSlurm(time_limit_min=10**5), SlurmConfig(), "j")   # no site limit
    with pytest.raises(InfeasibleRequest, match=r"j: --time of 91 min exceeds this site's "
                       r"limit of 90 min \(\[slurm\] time_limit_min\)"):
        refuse_over_site(JobSlurm(time_limit_min=91), SlurmConfig(time_limit_min=90), "j")


def test_every_unhonoured_directive_is_named_at_once_with_what_to_do() -> None:
    """An existing sbatch script: all its options weave cannot take in one line, each
    with its advice, values skipped (so '8' of '--ntasks 8' is not a second refusal)."""
    from weave_slurm.daemon.submission import read_directives

    script = ("#!/bin/bash\n#SBATCH -N 2 --ntasks 8\n#SBATCH --gres=gpu:8 -A phys\n"
              "#SBATCH --exclusive\n#SBATCH -p gpu --mail-type=END\npython train.py\n")
    with pytest.raises(ConfigError) as info:
        read_directives(script, "t.sh")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("t.sh: 6 #SBATCH options are not honoured")
    for where, word in (("t.sh:2", "-N"), ("t.sh:2", "--ntasks"), ("t.sh:3", "--gres"),
                        ("t.sh:4", "--exclusive"), ("t.sh:5", "-p"),
                        ("t.sh:5", "--mail-type")):
        assert f"{where} {word!r} (" in msg
    assert "--rollout-gpus/--train-gpus" in msg and "use --solo" in msg
    assert "rollout partition" in msg and "weave sends no mail" in msg
    assert "'8'" not in msg and "'gpu'" not in msg and msg.endswith(f"honoured: {HONOURED}")
