"""bench/gpu_check.py's --dry-run (CPU, small sizes): every section runs or is skipped
with its reason, the warm switch is bit-identical, moves exactly the model's and
Adam's bytes and releases the switched-out storages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "gpu_check.json"
    before = set(Path("/dev/shm").glob("weave-gpucheck-*"))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--json", str(out),
                           "--disk-dir", str(tmp_path), *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(Path("/dev/shm").glob("weave-gpucheck-*")) == before   # segments removed
    assert not list(tmp_path.glob("weave-gpucheck-*"))                # temp dir removed
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_dry_run_every_section(tmp_path: Path) -> None:
    r = _run(tmp_path)
    assert r["dry_run"] is True and r["device"] == "cpu"
    assert r["machine"]["torch"] and "device_name" in r["machine"]
    s = r["sections"]
    assert set(s) | set(r["skipped"]) == {"bandwidth", "switch", "cold", "vllm"}
    assert not r["skipped"]
    for name, sec in s.items():
        assert "error" not in sec, (name, sec.get("traceback"))

    modes = s["bandwidth"]["modes"]
    assert set(modes) == {"pageable", "pinned", "shm_staged", "shm_registered"}
    assert all(m["h2d_gb_s"] > 0 and m["d2h_gb_s"] > 0 for m in modes.values())
    assert modes["shm_registered"]["registered"] is False     # no CUDA: recorded, expected

    sw = s["switch"]
    assert 5e6 <= sw["params"] <= 20e6
    assert sw["grad_bytes"] == sw["param_bytes"] == 4 * sw["params"]
    assert sw["adam_moment_bytes"] == 2 * sw["param_bytes"]          # exp_avg + exp_avg_sq
    assert sw["expected_bytes"] == (sw["param_bytes"] + sw["grad_bytes"] + sw["buffer_bytes"]
                                    + sw["adam_moment_bytes"] + sw["adam_other_bytes"])
    assert sw["moved_bytes"] == sw["expected_bytes"] and sw["moved_equals_expected"]
    assert len(sw["runs"]) == 3
    for run in sw["runs"]:
        assert run["out"]["moved_bytes"] == run["in"]["moved_bytes"] == sw["expected_bytes"]
        assert run["storage_nbytes_after_out"] == 0 and run["held_bytes_after_out"] == 0
        assert run["in"]["held_bytes"] == sw["expected_bytes"]
        assert run["bit_identical"] and run["forward_ok"]
    assert sw["bit_identical"] and sw["identity_check"] == "all"
    assert sw["registered"] is False

    cold = s["cold"]
    assert cold["params"] == sw["params"]
    assert cold["spawn_to_loaded_s"] >= sum(cold["stages_s"].values()) - 1e-3
    assert cold["checkpoint"]["bytes"] > sw["param_bytes"]

    v = s["vllm"]
    assert "tokenizer.json" in v["model"]["files"] and "config.json" in v["model"]["files"]
    assert "skipped" in v or "steps" in v

    sm = r["summary"]
    assert sm["bit_identical"] and sm["storage_nbytes_after_out"] == 0
    assert sm["cold_over_warm"] is not None and sm["cold_over_warm"] > 0
    assert r["elapsed_s"] < 60


def test_time_budget_and_skips(tmp_path: Path) -> None:
    r = _run(tmp_path, "--timeout", "0", "--skip-cold")
    assert r["sections"] == {}
    assert r["skipped"]["cold"] == "--skip-cold"
    for name in ("bandwidth", "switch", "vllm"):
        assert "time budget" in r["skipped"][name]
    assert r["summary"]["cold_over_warm"] is None


def test_model_size_option() -> None:
    from bench.gpu_check_parts import llama_options

    for params_b in (0.5, 1.0, 1.5):
        o = llama_options(params_b)
        h, i, v, n = (o["hidden_size"], o["intermediate_size"], o["vocab_size"],
                      o["num_hidden_layers"])
        count = 2 * v * h + h + n * (4 * h * h + 3 * h * i + 2 * h)
        assert abs(count / 1e9 - params_b) < 0.15 * params_b
        assert h % o["num_attention_heads"] == 0


FAKE_VLLM = '''
__version__ = "0.0-fake"
calls = []

class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw

class _Out:
    token_ids = [5, 6, 7]
    text = "w1 w2 w3"

class _Req:
    outputs = [_Out()]

class _Executor:
    def collective_rpc(self, method):
        assert method == "reload_weights"
        return [None]

class _Engine:
    model_executor = _Executor()

class LLM:
    def __init__(self, model, **kw):
        assert kw["enable_sleep_mode"] and kw["enforce_eager"]
        self.llm_engine = _Engine()
        self.asleep = False

    def generate(self, prompts, sp):
        assert not self.asleep
        return [_Req() for _ in prompts]

    def sleep(self, level):
        self.asleep = True

    def wake_up(self, tags=None):
        self.asleep = False

    def collective_rpc(self, method):    # as an old vLLM without it: the next is tried
        raise AttributeError("no collective_rpc here")

    def reset_prefix_cache(self):
        return True
'''


def test_vllm_child_script_with_a_fake_vllm(tmp_path: Path) -> None:
    """The child's steps and its reload fallbacks (vLLM itself needs CUDA)."""
    from bench.gpu_check_parts import VLLM, run_child

    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "vllm.py").write_text(FAKE_VLLM)
    out, wall = run_child(VLLM, [str(tmp_path)], 60,
                          env={"PYTHONPATH": str(tmp_path / "fake")})
    assert out["vllm"] == "0.0-fake" and "skipped" not in out
    assert out["order"] == ["import_vllm", "load", "generate_first", "sleep_level1",
                            "wake_up", "generate_after_level1", "sleep_level2",
                            "wake_up_weights", "reload_weights", "wake_up_kv_cache",
                            "reset_prefix_cache", "generate_after_level2"]
    assert all(rec["ok"] for rec in out["steps"].values()), out["steps"]
    reload = out["steps"]["reload_weights"]["result"]
    assert reload["via"] == "model_executor.collective_rpc('reload_weights')"
    assert [f.split(":")[0] for f in reload["failed"]] == ["llm", "llm_engine"]
    assert out["steps"]["generate_after_level2"]["result"]["tokens"] == 3
    assert wall > 0


def test_vllm_child_script_without_vllm(tmp_path: Path) -> None:
    from bench.gpu_check_parts import VLLM, run_child

    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "vllm.py").write_text("raise ImportError('no vllm in this test')")
    out, _ = run_child(VLLM, [str(tmp_path)], 60, env={"PYTHONPATH": str(tmp_path / "fake")})
    assert out["skipped"].startswith("import vllm failed: ImportError: no vllm in this test")
    assert out["order"] == ["import_vllm"]
