"""The command door: errors carry evidence, hung commands are killed, fakes refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.processes import pid_alive
from tests.harness.waits import settle
from weave_slurm.errors import ExternalCommandError
from weave_slurm.slurm.command_runner import SlurmCommandError, SubprocessRunner, run_command
from weave_slurm.slurm.fake_runner import FakeReply, FakeRunner, UnexpectedCommand


def test_success_returns_output_and_env_overlay() -> None:
    res = run_command(["sh", "-c", "echo out; echo $WEAVE_X >&2"], env={"WEAVE_X": "42"})
    assert res.returncode == 0
    assert res.stdout == "out\n"
    assert res.stderr == "42\n"
    assert res.argv == ("sh", "-c", "echo out; echo $WEAVE_X >&2")


def test_failure_carries_argv_code_stdout_stderr() -> None:
    with pytest.raises(SlurmCommandError) as info:
        run_command(["sh", "-c", "echo partial; echo 'salloc: error: boom' >&2; exit 3"])
    err = info.value
    assert isinstance(err, ExternalCommandError)
    assert err.argv == ["sh", "-c", "echo partial; echo 'salloc: error: boom' >&2; exit 3"]
    assert err.returncode == 3
    assert err.stdout == "partial\n"
    assert "boom" in err.stderr
    assert not err.timed_out
    assert "(exit 3)" in str(err) and "salloc: error: boom" in str(err)


def test_check_false_returns_nonzero() -> None:
    assert run_command(["sh", "-c", "exit 5"], check=False).returncode == 5


def test_hung_command_is_killed_with_its_children() -> None:
    with pytest.raises(SlurmCommandError) as info:
        run_command(["sh", "-c", "sleep 60 & echo $!; wait"], timeout_s=0.5)
    err = info.value
    assert err.timed_out and err.returncode is None
    assert "timed out after 0.5 s" in str(err)
    child = int(err.stdout.split()[0])
    assert not settle(lambda: pid_alive(child), 5, until=lambda alive: not alive), \
        "the hung command's child survived the kill"


def test_missing_program_is_an_error_not_an_oserror() -> None:
    with pytest.raises(SlurmCommandError) as info:
        run_command(["weave-no-such-program-xyz"])
    assert info.value.returncode is None
    assert "cannot start" in info.value.stderr


def test_empty_argv_is_refused() -> None:
    with pytest.raises(SlurmCommandError):
        run_command([])


def test_spawn_writes_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "step.log"
    proc = SubprocessRunner().spawn(["sh", "-c", "echo hello; echo err >&2; exit 4"],
                                    log_path=log)
    assert proc.wait(timeout=10) == 4
    assert log.read_text().splitlines() == ["hello", "err"]


def test_fake_runner_refuses_unscripted_commands() -> None:
    fake = FakeRunner()
    fake.on(["squeue"], FakeReply(stdout="{}"))
    with pytest.raises(UnexpectedCommand, match="sbatch"):
        fake.run(["sbatch", "x.sh"])
    with pytest.raises(UnexpectedCommand):
        fake.spawn(["srun", "true"])
    assert fake.run(["squeue", "--json"]).stdout == "{}"
    assert fake.argvs() == [("sbatch", "x.sh"), ("srun", "true"), ("squeue", "--json")]


def test_fake_runner_prefers_the_most_specific_prefix() -> None:
    fake = FakeRunner()
    fake.on(["squeue"], FakeReply(stdout="jobs"))
    fake.on(["squeue", "--steps"], FakeReply(stdout="steps"))
    assert fake.run(["squeue", "--steps", "-h"]).stdout == "steps"
    assert fake.run(["squeue", "--json"]).stdout == "jobs"


def test_fake_runner_failures_and_hangs_look_real() -> None:
    fake = FakeRunner()
    fake.on(["scancel"], FakeReply(stderr="scancel: error: nope", returncode=1))
    fake.on(["salloc"], FakeReply(hang=True))
    with pytest.raises(SlurmCommandError) as info:
        fake.run(["scancel", "7"])
    assert info.value.returncode == 1 and info.value.stderr == "scancel: error: nope"
    assert fake.run(["scancel", "7"], check=False).returncode == 1
    with pytest.raises(SlurmCommandError) as hung:
        fake.run(["salloc", "--no-shell"], timeout_s=3)
    assert hung.value.timed_out


def test_fake_runner_callable_reply_sees_argv() -> None:
    fake = FakeRunner()
    fake.on(["echo"], lambda argv: FakeReply(stdout=" ".join(argv[1:])))
    assert fake.run(["echo", "a", "b"]).stdout == "a b"
