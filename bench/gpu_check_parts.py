"""Helpers of bench/gpu_check.py: models, host buffers, timing, the child scripts.

Everything here runs on a CPU device too (the ``--dry-run``); the CUDA calls are
behind ``is_cuda(device)``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from weave_slurm.device.hostmem import is_cuda

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}


def gb_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 else 0.0


def r6(x: float) -> float:
    return round(x, 6)


def err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:800]


def sync(device: str) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: str, repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of ``fn`` (synchronised) for each of ``repeats`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
        sync(device)
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


# -- machine facts --------------------------------------------------------------------
def machine_facts(device: str) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "host_mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }
    try:
        import transformers
        facts["transformers"] = transformers.__version__
    except ImportError as exc:
        facts["transformers"] = err(exc)
    if os.path.isdir("/dev/shm"):
        facts["dev_shm_free_bytes"] = shutil.disk_usage("/dev/shm").free
    if is_cuda(device) and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(device)
        facts.update(device_name=p.name, device_total_memory_bytes=p.total_memory,
                     capability=f"{p.major}.{p.minor}",
                     multiprocessors=p.multi_processor_count,
                     cudnn=torch.backends.cudnn.version())  # type: ignore[no-untyped-call]
    else:
        facts.update(device_name="cpu", device_total_memory_bytes=None)
    return facts


def mem_state(device: str) -> dict[str, int | None]:
    if not is_cuda(device):
        return {"allocated": None, "reserved": None, "free": None, "total": None}
    free, total = torch.cuda.mem_get_info(device)
    return {"allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device), "free": free, "total": total}


# -- host memory ----------------------------------------------------------------------
def host_dir(need_bytes: int, fallback: Path) -> tuple[Path, str]:
    """/dev/shm when it has room for ``need_bytes`` (plus 1 GiB), else ``fallback``."""
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > need_bytes + (1 << 30):
        return Path("/dev/shm"), "shm"
    return fallback, "disk (/dev/shm too small)"


@contextmanager
def seg_file(directory: Path, tag: str, nbytes: int) -> Iterator[Path]:
    """A fallocated file of ``nbytes``, always removed afterwards."""
    path = directory / f"weave-gpucheck-{os.getpid()}-{tag}.seg"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)
        yield path
    finally:
        path.unlink(missing_ok=True)


def drop_cache(path: Path) -> str:
    from bench.warm_switch import fadvise_drop

    fadvise_drop(path)
    return "fsync+fadvise(DONTNEED)"


# -- the model ------------------------------------------------------------------------
def llama_options(params_b: float) -> dict[str, Any]:
    """A LlamaConfig's keywords for about ``params_b`` billion parameters (untied)."""
    hidden = max(256, 128 * round(2048 * math.sqrt(params_b) / 128))
    inter = 64 * round(2.75 * hidden / 64)
    vocab = 32000 if params_b >= 0.1 else 4096
    heads = hidden // 128 if hidden >= 1024 else hidden // 64
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((params_b * 1e9 - 2 * vocab * hidden) / per_layer))
    return {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": heads, "max_position_embeddings": 512,
            "tie_word_embeddings": False}


def build_model(options: dict[str, Any], device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**options))
    return model


def sample_ids(options: dict[str, Any], device: str, batch: int = 2,
               seq: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, options["vocab_size"], (batch, seq), generator=g).to(device)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()            # the moments exist now; the gradients are kept
    return float(loss.detach())


class SwitchJob:
    """A job as DeviceSwitch sees it (SwitchesDevice): the model's and Adam's tensors."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt

    def device_tensors(self) -> dict[str, torch.Tensor]:
        from weave_slurm.device.switch import module_tensors, optimizer_tensors

        return {**module_tensors(self.model, "model"), **optimizer_tensors(self.opt, "adam")}


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer,
                device: str) -> dict[str, int]:
    """Bytes of the model's parameters, gradients and buffers and of Adam's state that
    live on ``device`` (counted here, independently of DeviceSwitch)."""
    kind = torch.device(device).type

    def nb(t: torch.Tensor) -> int:
        return t.numel() * t.element_size() if t.device.type == kind else 0

    params = list(model.parameters())
    out = {"param_bytes": sum(nb(p) for p in params),
           "grad_bytes": sum(nb(p.grad) for p in params if p.grad is not None),
           "buffer_bytes": sum(nb(b) for b in model.buffers()),
           "adam_moment_bytes": 0, "adam_other_bytes": 0}
    for st in opt.state.values():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                out["adam_moment_bytes" if key.startswith("exp_avg") else
                    "adam_other_bytes"] += nb(v)
    out["expected_bytes"] = sum(out.values())
    return out


# -- child processes ------------------------------------------------------------------
def run_child(code: str, args: list[str], timeout_s: float,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    """``python -c code args``; its last stdout line as JSON, and the wall seconds."""
    repo = str(Path(__file__).resolve().parents[1])
    env = env or {}
    path = os.pathsep.join(p for p in (env.get("PYTHONPATH"), repo, os.environ.get("PYTHONPATH"))
                           if p)
    full_env = {**os.environ, **OFFLINE_ENV, **env, "PYTHONPATH": path}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(t0), *args], env=full_env,
                          capture_output=True, text=True, timeout=max(1.0, timeout_s))
    wall = time.monotonic() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child exited {proc.returncode}: {proc.stderr[-1500:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    out["child_stderr_tail"] = proc.stderr[-600:]
    return out, wall


# python -c COLD t_spawn options_json ckpt device: a cold start, stage by stage
COLD = r"""
import time
t_start = time.monotonic()
import json, sys
import torch
t_torch = time.monotonic()
from transformers import LlamaConfig, LlamaForCausalLM
t_tf = time.monotonic()
t_spawn, options = float(sys.argv[1]), json.loads(sys.argv[2])
ckpt, device = sys.argv[3], sys.argv[4]
cuda = device.startswith("cuda")
def sync():
    if cuda:
        torch.cuda.synchronize(device)
if cuda:
    torch.cuda.init()
    torch.empty(1, device=device)
    sync()
t_cuda = time.monotonic()
torch.manual_seed(0)
with torch.device(device):
    model = LlamaForCausalLM(LlamaConfig(**options))
sync()
t_build = time.monotonic()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
t_adam = time.monotonic()
state = torch.load(ckpt, map_location="cpu", weights_only=True)
t_read = time.monotonic()
model.load_state_dict(state["model"])
opt.load_state_dict(state["optim"])
sync()
t_loaded = time.monotonic()
n = sum(p.numel() for p in model.parameters())
print(json.dumps({"params": n, "stages_s": {
    "spawn_to_python": t_start - t_spawn, "import_torch": t_torch - t_start,
    "import_transformers": t_tf - t_torch, "cuda_init": t_cuda - t_tf,
    "build_model": t_build - t_cuda, "create_adam": t_adam - t_build,
    "read_checkpoint": t_read - t_adam, "load_to_device": t_loaded - t_read},
    "spawn_to_loaded_s": t_loaded - t_spawn}))
"""


# python -c VLLM t_spawn model_dir: sleep / wake-up timings, each step recorded
VLLM = r"""
import json, sys, time
res = {"steps": {}, "order": []}
t_spawn, model_dir = float(sys.argv[1]), sys.argv[2]
torch = None
def free():
    try:
        return torch.cuda.mem_get_info()[0] if torch is not None else None
    except Exception:
        return None
def step(name, fn):
    t = time.monotonic()
    rec = {}
    try:
        out = fn()
        rec["ok"] = True
        if isinstance(out, dict):
            rec["result"] = out
    except Exception as exc:
        rec.update(ok=False, error=(type(exc).__name__ + ": " + str(exc))[:800])
        out = None
    rec["s"] = round(time.monotonic() - t, 4)
    rec["free_bytes_after"] = free()
    res["steps"][name] = rec
    res["order"].append(name)
    return out
vllm = step("import_vllm", lambda: __import__("vllm"))
if vllm is None:
    res["skipped"] = "import vllm failed: " + res["steps"]["import_vllm"]["error"]
    print(json.dumps(res))
    sys.exit(0)
import torch
res["vllm"] = getattr(vllm, "__version__", "?")
llm = step("load", lambda: vllm.LLM(model=model_dir, enable_sleep_mode=True,
           gpu_memory_utilization=0.3, enforce_eager=True, max_model_len=256, seed=0))
def gen():
    sp = vllm.SamplingParams(max_tokens=8, temperature=0.0)
    out = llm.generate(["w1 w2 w3 w4"], sp)
    return {"tokens": len(out[0].outputs[0].token_ids), "text": out[0].outputs[0].text[:80]}
def reload():
    tried = []
    for where in ("llm", "llm_engine", "model_executor"):
        try:
            obj = {"llm": lambda: llm, "llm_engine": lambda: llm.llm_engine,
                   "model_executor": lambda: llm.llm_engine.model_executor}[where]()
            obj.collective_rpc("reload_weights")
            return {"via": where + ".collective_rpc('reload_weights')", "failed": tried}
        except Exception as exc:
            tried.append(where + ": " + (type(exc).__name__ + ": " + str(exc))[:300])
    raise RuntimeError("; ".join(tried))
if llm is not None:
    step("generate_first", gen)
    step("sleep_level1", lambda: llm.sleep(level=1))
    step("wake_up", lambda: llm.wake_up())
    step("generate_after_level1", gen)
    step("sleep_level2", lambda: llm.sleep(level=2))
    step("wake_up_weights", lambda: llm.wake_up(tags=["weights"]))
    step("reload_weights", reload)
    step("wake_up_kv_cache", lambda: llm.wake_up(tags=["kv_cache"]))
    step("reset_prefix_cache", lambda: llm.reset_prefix_cache())
    step("generate_after_level2", gen)
res["spawn_to_end_s"] = time.monotonic() - t_spawn
print(json.dumps(res, default=str))
"""


def make_vllm_model_dir(path: Path) -> dict[str, Any]:
    """A tiny bf16 Llama with random weights and a local word-level tokenizer, saved with
    save_pretrained into ``path`` (no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab_size = 512
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {t: i for i, t in enumerate(specials)}
    vocab.update({f"w{i}": len(specials) + i for i in range(vocab_size - len(specials))})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>")
    fast.save_pretrained(str(path))
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=704,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                      pad_token_id=3, tie_word_embeddings=False)
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(str(path))
    return {"params": sum(p.numel() for p in model.parameters()),
            "files": sorted(p.name for p in path.iterdir())}
