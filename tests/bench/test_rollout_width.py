"""bench/rollout_width.py: its JSON on two engine counts (the merged batch the one-engine
batch, a profile line placement can read), the floor's fit, and its usage errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

from weave_slurm.config.job import parse_job

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "rollout_width.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rollout_width", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_two_engine_counts_give_the_same_batch_and_a_profile_line(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "throughput", "--engines",
                           "1,2", "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    res = json.loads(out.read_text())["sizes"]["throughput"]
    assert [r["engines"] for r in res["rows"]] == [1, 2]
    assert all(r["identical_to_one"] for r in res["rows"])
    assert len(res["rows"][1]["engine_s"]) == 2 and 0 <= res["floor_fraction"] <= 1
    spec = parse_job('name = "j"\nalgorithm = "grpo"\n[model]\nparams_b = 1\n[rollout]\n'
                     'prompts_per_step = 8\nsamples_per_prompt = 2\nmax_response_tokens = 64\n'
                     f'[gpus]\nrollout = 1\ntrain = 1\n[profile]\n{res["profile_line"]}\n')
    assert [g for g, _ in spec.profile.rollout_width_s] == [1, 2]


def test_the_floor_is_what_no_width_removes() -> None:
    fit = _module()._fit
    a, b = fit([1, 2, 4, 8], [10 / e + 2 for e in (1, 2, 4, 8)])
    assert (a, b) == pytest.approx((10, 2))
    assert fit([1, 2], [1.0, 0.4]) == pytest.approx((1 / 1.25 + 0.4 / 2 / 1.25, 0.0))  # b >= 0


@pytest.mark.parametrize(("args", "words"), [
    (["--engines", "2,1"], "--engines: rising integers >= 1"),
    (["--engines", "a"], "--engines: comma-separated integers"),
    (["--repeats", "0"], "--repeats: must be >= 1"),
    (["--sizes", "huge"], "--sizes: unknown 'huge'; valid: throughput, few-sequences"),
])
def test_usage_errors_name_the_flag(args: list[str], words: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    main = _module().main
    with mock.patch.object(sys, "argv", [str(SCRIPT), *args]), \
            pytest.raises(SystemExit) as ended:
        main()
    assert ended.value.code == 2 and words in capsys.readouterr().err
