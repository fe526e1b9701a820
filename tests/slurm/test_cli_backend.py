"""SlurmCliBackend against a fake runner: the exact commands, and error mapping."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from weave_slurm.errors import ConfigError, InfeasibleRequest, InsufficientResources, StateError
from weave_slurm.slurm.backend import (
    AllocationRequest,
    ResourceSpec,
    StepHandle,
    StepSpec,
    StepState,
)
from weave_slurm.slurm.cli_backend import SlurmCliBackend, sbatch_argv, srun_argv
from weave_slurm.slurm.command_runner import SlurmCommandError
from weave_slurm.slurm.fake_runner import FakeReply, FakeRunner
from weave_slurm.slurm.templates import ALLOCATION_TEMPLATE, render_allocation

FIX = Path(__file__).parent / "fixtures"
ENV = {"SLURM_CONF": "/x/slurm.conf"}
H20 = ResourceSpec("h20", 2, 8, "h20", 8)
H800 = ResourceSpec("h800", 1, 8, "h800", 16)


def _backend(fake: FakeRunner, uid: int = 0) -> SlurmCliBackend:
    """A backend of ``uid`` (the fixture's jobs are root's, uid 0)."""
    fake.on(["squeue", "--json"], FakeReply(stdout=(FIX / "squeue_22.05_het.json").read_text()))
    return SlurmCliBackend(runner=fake, env=ENV, uid=uid)


def test_the_allocation_is_the_rendered_script_submitted_with_sbatch() -> None:
    req = AllocationRequest("8", "het", (H20, H800), time_limit_min=90, immediate_s=5)
    text = render_allocation(req)
    assert ("#SBATCH --time=90\n"
            "#SBATCH --partition=h20\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
            "#SBATCH --cpus-per-task=8\n#SBATCH --gres=gpu:h20:8\n#SBATCH hetjob\n"
            "#SBATCH --partition=h800\n") in text
    assert "#SBATCH --job-name=weave-g8-het\n#SBATCH --comment=weave:default:8:het\n" in text
    no_gpu = AllocationRequest("1", "cpu", (ResourceSpec("h20", 1),))
    assert "--gres" not in render_allocation(no_gpu)
    tagged = AllocationRequest("t1.4", "h20-0", (H20,), instance="t1")
    assert ("--job-name=weave-gt1.4-h20-0\n#SBATCH --comment=weave:t1:t1.4:h20-0"
            in render_allocation(tagged))
    assert sbatch_argv(Path("/x/a.sbatch")) == ["sbatch", "--parsable", "--no-requeue",
                                                "/x/a.sbatch"]
    with pytest.raises(ConfigError, match="instance='t-1'"):
        AllocationRequest("1", "h20", (H20,), instance="t-1").validate()


def test_srun_argv_always_has_overlap_exact_n_c() -> None:
    spec = StepSpec("roll-a", ("python", "-m", "x"), ntasks=4, cpus_per_task=2, node_count=2,
                    nodelist=("h20-0", "h20-1"), gpus_per_node=2, het_group=1,
                    slurm_args=("--weave-slo=1.5",))
    assert srun_argv("12", spec) == [
        "srun", "--jobid=12", "--overlap", "--exact", "--job-name=roll-a", "-n", "4", "-c", "2",
        "-N", "2", "--nodelist=h20-0,h20-1", "--gres=gpu:2", "--het-group=1",
        "--weave-slo=1.5", "python", "-m", "x"]


def test_allocate_submits_the_script_and_reads_back_from_squeue(tmp_path: Path) -> None:
    fake = FakeRunner()
    fake.on(["sbatch", "--parsable"], FakeReply(stdout="3\n"))
    backend = _backend(fake)
    backend.log_dir = tmp_path
    alloc = backend.allocate(AllocationRequest("8", "het", (H20, H800)))
    assert alloc.alloc_id == "3" and alloc.heterogeneous
    kept = tmp_path / "allocations" / "weave-g8-het.sbatch"
    assert fake.calls[0].argv == ("sbatch", "--parsable", "--no-requeue", str(kept))
    assert fake.calls[0].env == ENV and "#SBATCH hetjob" in kept.read_text()


def test_a_site_template_is_what_is_submitted(tmp_path: Path) -> None:
    site = tmp_path / "site-alloc.sbatch"
    site.write_text(ALLOCATION_TEMPLATE.read_text().replace("exec @@", "# SITE\nexec @@"))
    fake = FakeRunner()
    fake.on(["sbatch", "--parsable"], FakeReply(stdout="3;cluster\n"))
    backend = SlurmCliBackend(runner=fake, env=ENV, uid=0, log_dir=tmp_path, template=site)
    fake.on(["squeue", "--json"], FakeReply(stdout=(FIX / "squeue_22.05_het.json").read_text()))
    assert backend.allocate(AllocationRequest("8", "het", (H20, H800))).alloc_id == "3"
    assert "# SITE" in (tmp_path / "allocations" / "weave-g8-het.sbatch").read_text()


@pytest.mark.parametrize(("stderr", "exc"), [
    ("sbatch: error: Batch job submission failed: Requested node configuration is not "
     "available", InfeasibleRequest),
    ("sbatch: error: invalid partition specified: nope", InfeasibleRequest),
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job "
     "submit limit, user's size and/or time limits)", InsufficientResources),
])
def test_allocate_maps_refusals_to_next_moves(stderr: str, exc: type[Exception]) -> None:
    fake = FakeRunner()
    fake.on(["sbatch"], FakeReply(stderr=stderr, returncode=1))
    with pytest.raises(exc, match="weave-g1-h20"):
        _backend(fake).allocate(AllocationRequest("1", "h20", (H20,)))


def test_allocate_hang_is_insufficient_and_other_errors_pass_through() -> None:
    fake = FakeRunner()
    fake.on(["sbatch"], FakeReply(hang=True))
    with pytest.raises(InsufficientResources):
        _backend(fake).allocate(AllocationRequest("1", "h20", (H20,)))
    fake2 = FakeRunner()
    fake2.on(["sbatch"], FakeReply(stderr="sbatch: error: munge decode failed", returncode=1))
    with pytest.raises(SlurmCommandError, match="munge"):
        _backend(fake2).allocate(AllocationRequest("1", "h20", (H20,)))


def test_allocate_without_a_job_id_is_a_state_error() -> None:
    fake = FakeRunner()
    fake.on(["sbatch"], FakeReply(stdout="sbatch: something else"))
    with pytest.raises(StateError, match="no job id"):
        _backend(fake).allocate(AllocationRequest("1", "h20", (H20,)))


def test_still_pending_after_immediate_s_is_cancelled_and_insufficient() -> None:
    """salloc --immediate's meaning: not started within immediate_s, the job is cancelled
    (never left queued behind weaved's back) and the caller retries later."""
    data = json.loads((FIX / "squeue_22.05_het.json").read_text())
    for job in data["jobs"]:
        if job["job_id"] == 3:
            job["job_state"] = "PENDING"
    fake = FakeRunner()
    fake.on(["squeue", "--json"], FakeReply(stdout=json.dumps(data)))
    fake.on(["sbatch"], FakeReply(stdout="3\n"))
    fake.on(["scancel"], FakeReply())
    backend = SlurmCliBackend(runner=fake, env=ENV, uid=0)
    with pytest.raises(InsufficientResources, match="job 3 still pending after 0 s"):
        backend.allocate(AllocationRequest("8", "het", (H20, H800), immediate_s=0))
    assert ("scancel", "3") in fake.argvs()


def test_allocate_reads_back_only_an_allocation_of_its_own_instance() -> None:
    fake = FakeRunner()
    fake.on(["sbatch"], FakeReply(stdout="3\n"))
    with pytest.raises(StateError, match="squeue does not list it"):   # job 3 is default's
        _backend(fake).allocate(AllocationRequest("8", "het", (H20, H800), instance="t1"))


def test_list_allocations_drops_ended_jobs() -> None:
    fake = FakeRunner()
    allocs = _backend(fake).list_allocations()
    assert [a.alloc_id for a in allocs] == ["2", "3"]
    assert fake.argvs() == [("squeue", "--json", "--user=0")]


def test_list_allocations_are_this_uids_and_of_one_instance() -> None:
    """squeue is asked for one user's jobs AND each row's user_id is checked: an answer
    listing everyone's (as squeue --json may) never makes another user's job ours."""
    fake = FakeRunner()
    other = _backend(fake, uid=1000)
    assert other.list_allocations() == ()
    assert fake.argvs() == [("squeue", "--json", "--user=1000")]
    root = _backend(FakeRunner())
    assert [a.alloc_id for a in root.list_allocations(instance="default")] == ["3"]
    assert root.list_allocations(instance="t1") == ()
    (het,) = root.list_allocations("weave-g8")
    assert (het.instance, het.group_id, het.pool) == ("default", "8", "het")  # an old comment


def test_release_is_idempotent() -> None:
    fake = FakeRunner()
    fake.on(["scancel"], FakeReply(stderr="scancel: error: Kill job error on job id 9: Invalid "
                                          "job id specified", returncode=1))
    backend = _backend(fake)
    backend.release("9")
    assert fake.argvs("scancel") == [("scancel", "9")]


def test_steps_launch_poll_cancel() -> None:
    fake = FakeRunner()
    fake.on(["srun"], FakeReply())
    fake.on(["squeue", "--steps"], FakeReply(stdout="8.0|roll|h20-[0-1]|2\n8.1|other|h20-0|1\n"))
    fake.on(["scancel"], FakeReply())
    backend = _backend(fake)
    handle = backend.launch_step("8", StepSpec("roll", ("sleep", "9"), ntasks=2,
                                               env={"A": "1"}))
    (call,) = [c for c in fake.calls if c.spawned]
    assert call.env == {**ENV, "A": "1"}
    assert backend.poll_step(handle).state is StepState.RUNNING
    assert [s.name for s in backend.list_steps("8")] == ["roll", "other"]
    fake.processes[0].returncode = -signal.SIGTERM  # srun exits once its step is cancelled
    backend.cancel_step(handle, timeout_s=1)
    assert fake.argvs("scancel") == [("scancel", "8.0")]
    assert backend.poll_step(handle).state is StepState.CANCELLED


def test_step_exit_codes_and_adopted_handles() -> None:
    fake = FakeRunner()
    fake.on(["srun"], FakeReply())
    fake.on(["squeue", "--steps"], FakeReply(stdout="8.0|roll|h20-0|1\n"))
    backend = _backend(fake)
    ok = backend.launch_step("2", StepSpec("a", ("true",)))
    bad = backend.launch_step("2", StepSpec("b", ("false",)))
    fake.processes[0].returncode, fake.processes[1].returncode = 0, 2
    assert backend.poll_step(ok).state is StepState.COMPLETED
    status = backend.poll_step(bad)
    assert (status.state, status.returncode) == (StepState.FAILED, 2)
    fresh = _backend(fake)  # a restarted daemon knows only what Slurm lists
    assert fresh.poll_step(StepHandle("8", "roll", 1)).state is StepState.RUNNING
    assert fresh.poll_step(StepHandle("8", "gone", 1)).state is StepState.UNKNOWN


def test_a_piped_step_is_one_srun_task_with_pipes() -> None:
    fake = FakeRunner()
    fake.on(["srun"], FakeReply(stdout="READY\n"))
    b = SlurmCliBackend(runner=fake, env=ENV)
    proc = b.open_step("42", StepSpec("weave-sync", ("python", "-m", "agent"), node_count=1,
                                      nodelist=("h800-0",), env={"OMP_NUM_THREADS": "1"}))
    assert proc.stdout is not None and proc.stdout.readline() == b"READY\n"
    (call,) = fake.calls
    assert call.argv == ("srun", "--jobid=42", "--overlap", "--exact", "--job-name=weave-sync",
                         "-n", "1", "-c", "1", "-N", "1", "--nodelist=h800-0",
                         "python", "-m", "agent")
    assert call.env == {**ENV, "OMP_NUM_THREADS": "1"} and call.spawned
    with pytest.raises(ConfigError, match="one task"):
        b.open_step("42", StepSpec("x", ("true",), ntasks=2))


def test_an_exited_srun_nobody_polls_is_reaped_with_the_next_look_at_slurm(
        tmp_path: Path) -> None:
    """A node daemon's srun whose allocation was released is never polled again: it was
    left a zombie of weaved (#33: '[srun] <defunct>' minutes later). Each squeue look
    collects it; its exit status stays known."""
    import subprocess
    import time

    class Spawns(FakeRunner):        # scripted Slurm answers, a real child for srun
        def spawn(self, argv, *, env=None, log_path=None):  # type: ignore[no-untyped-def]
            super().spawn(argv, env=env, log_path=log_path)
            return subprocess.Popen(["true"])

    fake = Spawns()
    fake.on(["srun"], FakeReply())
    backend = _backend(fake)
    handle = backend.launch_step("2", StepSpec("weave-node", ("sleep", "0")))
    pid = handle.launcher_pid
    deadline = time.monotonic() + 10
    while _state(pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _state(pid) == "Z"                       # exited, not collected
    backend.list_allocations()
    assert _state(pid) is None                      # reaped
    assert backend.poll_step(handle).state is StepState.COMPLETED


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None
