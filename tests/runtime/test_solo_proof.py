"""The proof shown to the user (issue 30, item 6): a job run in a group and the same spec
run alone (``weave-sbatch --solo``) end with the same weights, which ``weave show job``
prints as a SHA-256 that weaved keeps in its store across a restart, and ``weave
compare`` says so (exit 0; 1 for two different jobs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.scratch import public_dir, shm_dir
from tests.harness.specs import job_spec
from tests.harness.weaved import call, release_all, rl_config, serve, wait_states
from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.main import app as weave_app
from weave_slurm.cli.sbatch import app as sbatch_app
from weave_slurm.daemon.protocol import Op

pytestmark = pytest.mark.torch

STEPS = 2


def _weave(capsys: pytest.CaptureFixture[str], sock: Path, *argv: str) -> tuple[int, str]:
    code = run_app(weave_app, "weave", [*argv, "--socket", str(sock)])
    return code, capsys.readouterr().out


def test_a_grouped_job_and_its_solo_run_end_with_one_digest_kept_across_a_restart(
        capsys: pytest.CaptureFixture[str]) -> None:
    with public_dir("weaved-solo-") as public, shm_dir("weaved-solo-") as shm:
        cfg = rl_config(public, shm)
        served = serve(cfg)
        try:
            sock = cfg.socket
            a, b = (call(sock, Op.SUBMIT, spec=job_spec(n, seed, STEPS), source=n)["job"]
                    for n, seed in (("a", 21), ("b", 22)))
            spec = public / "a.toml"
            spec.write_text(job_spec("a", 21, STEPS))
            assert run_app(sbatch_app, "weave-sbatch", ["--solo", "--parsable", "--socket",
                                                        str(sock), str(spec)]) == 0
            alone = int(capsys.readouterr().out)
            seen: list[dict[str, object]] = []
            rows = wait_states(sock, [a, b, alone], {"COMPLETED", "FAILED"}, 300, seen)
            assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
            group = {r["job"]: r["group"] for r in seen if r["group"] is not None}
            assert group[a] == group[b] != group[alone]            # a and b shared one
            assert all(r["solo"] is (r["job"] == alone) for r in seen)
            assert {r["job"] for r in seen if r["group"] == group[alone]} == {alone}
            shown = {j: call(sock, Op.SHOW, kind="job", id=j) for j in (a, b, alone)}
            assert shown[a]["weights_sha256"] == shown[alone]["weights_sha256"]
            assert shown[a]["weights_sha256"] != shown[b]["weights_sha256"]
            assert shown[a]["weights_sha256"] == shown[a]["runtime"]["weights_sha256"]
            served.stop()
            served = serve(cfg)   # a fresh weaved on the same state dir: nothing live
            again = call(sock, Op.SHOW, kind="job", id=a)
            assert "runtime" not in again
            assert again["weights_sha256"] == shown[a]["weights_sha256"]
            code, out = _weave(capsys, sock, "show", "job", str(alone))
            assert code == 0 and f"weights_sha256={shown[a]['weights_sha256']}\n" in out
            assert "solo=True\n" in out
            code, out = _weave(capsys, sock, "compare", str(a), str(alone))
            assert code == 0 and out.startswith(f"equal: jobs {a} and {alone} "), out
            code, out = _weave(capsys, sock, "compare", str(a), str(b))
            assert code == 1 and out.startswith("different: "), out
        finally:
            served.stop()
            release_all(served.weaved.backend)
