"""One prepared GPU check of the warm device switch (one NVIDIA GPU, under 8 minutes).

Sections, each timed and recorded in one JSON file (default
``bench/results/gpu_check.json``; a ``--dry-run`` writes ``gpu_check_dry_run.json``):

1. ``bandwidth``: host<->device GB/s (median of ``--repeats``) for pageable host memory,
   pinned memory (``pin_memory=True``), a file segment under /dev/shm mapped with
   ``segments.map_file`` and registered with ``HostRegistry`` (copied with
   ``Copier(pinned=True)``; the one-time ``cudaHostRegister`` seconds apart), and the
   same segment unregistered, through ``Copier``'s pinned staging buffer.
2. ``switch``: the warm switch (``DeviceSwitch``, ``SwitchMode.ON``) of a transformers
   Llama with random weights (``--params-b`` billion parameters, fp32) after one Adam
   step: parameters, gradients, buffers, ``exp_avg`` and ``exp_avg_sq`` out into a
   registered segment laid out with ``plan_layout`` and back, ``--switch-repeats``
   times; bytes, seconds, GB/s, the fraction of the pinned rate (goal >= 0.8), device
   memory before/after, bit identity and a forward pass after every switch in.
3. ``cold``: a fresh ``python`` that imports torch, initialises CUDA, builds the same
   model, creates Adam and loads a checkpoint of its state (page cache dropped first);
   cold / warm = its spawn-to-loaded seconds over the switch-in seconds (goal >= 71.5).
4. ``vllm``: when ``import vllm`` works and CUDA is there, a tiny local Llama (random
   weights, a word-level tokenizer) in ``LLM(enable_sleep_mode=True)``: sleep level 1
   / wake, sleep level 2 / wake weights / ``reload_weights`` / wake kv cache, generate
   (each step's seconds or error; in a child process, so nothing here can crash).

Sections stop once ``--timeout`` seconds are used up (the rest are recorded as
skipped). ``--dry-run`` runs it all on the CPU with small sizes (the CUDA calls are
skipped: registration returns False there).

    python bench/gpu_check.py                     # on the GPU machine
    .venv/bin/python bench/gpu_check.py --dry-run # anywhere, < 1 min
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.gpu_check_parts import (  # noqa: E402
    COLD,
    VLLM,
    SwitchJob,
    build_model,
    drop_cache,
    err,
    gb_s,
    host_dir,
    llama_options,
    machine_facts,
    make_vllm_model_dir,
    median,
    mem_state,
    r6,
    run_child,
    sample_ids,
    seg_file,
    state_bytes,
    sync,
    timed,
    train_step,
)
from weave_slurm.device.hostmem import STAGING_BYTES, Copier, HostRegistry, is_cuda  # noqa: E402
from weave_slurm.device.switch import DeviceSwitch, SwitchMode  # noqa: E402
from weave_slurm.node.index import DEFAULT_ALIGN_BYTES, SegmentIndex, plan_layout  # noqa: E402
from weave_slurm.node.segments import dtype_name, map_file, tensor_views  # noqa: E402

GOAL_FRAC_OF_PINNED = 0.8
GOAL_COLD_OVER_WARM = 71.5
SECTIONS = ("bandwidth", "switch", "cold", "vllm")


# -- 1. bandwidth ---------------------------------------------------------------------
def bandwidth(device: str, nbytes: int, repeats: int, fallback: Path) -> dict[str, Any]:
    cuda = is_cuda(device)
    dev = torch.ones(nbytes, dtype=torch.uint8, device=device)
    modes: dict[str, dict[str, Any]] = {}

    def measure(name: str, host: torch.Tensor, copier: Copier | None, pinned: bool,
                extra: Mapping[str, Any]) -> None:
        def h2d() -> object:
            if copier is None:              # plain copy_, what a pageable tensor gets
                return dev.copy_(host)
            return copier.copy([(host, dev)], pinned=pinned)

        def d2h() -> object:
            if copier is None:
                return host.copy_(dev)
            return copier.copy([(dev, host)], pinned=pinned)

        th, td = timed(h2d, device, repeats), timed(d2h, device, repeats)
        modes[name] = {"h2d_gb_s": gb_s(nbytes, median(th)), "d2h_gb_s": gb_s(nbytes, median(td)),
                       "h2d_s": [r6(x) for x in th], "d2h_s": [r6(x) for x in td], **extra}

    pageable = torch.ones(nbytes, dtype=torch.uint8)
    measure("pageable", pageable, None, False, {})
    del pageable
    pinned = torch.ones(nbytes, dtype=torch.uint8, pin_memory=cuda)
    measure("pinned", pinned, Copier(device), True,
            {"pin_memory": cuda} if cuda else {"pin_memory": False,
                                               "note": "no CUDA: a plain host tensor"})
    del pinned
    directory, kind = host_dir(nbytes, fallback)
    with seg_file(directory, "bw", nbytes) as path:
        storage = map_file(path, nbytes)
        host = torch.empty(0, dtype=torch.uint8).set_(storage)
        measure("shm_staged", host, Copier(device), False,
                {"path_kind": kind, "staging_bytes": STAGING_BYTES})
        registry = HostRegistry()
        t = time.perf_counter()
        ok = registry.register(storage)
        reg_s = time.perf_counter() - t
        try:
            measure("shm_registered", host, Copier(device), True,
                    {"path_kind": kind, "registered": ok, "register_s": r6(reg_s),
                     "register_gb_s": gb_s(nbytes, reg_s) if ok else None,
                     "register_failures": registry.failures})
        finally:
            t = time.perf_counter()
            registry.close()
            modes["shm_registered"]["unregister_s"] = r6(time.perf_counter() - t)
        del host, storage
    return {"size_bytes": nbytes, "repeats": repeats, "modes": modes}


# -- 2. warm switch -------------------------------------------------------------------
def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def _snapshot(tensors: Mapping[str, torch.Tensor], device: str,
              total: int) -> tuple[str, dict[str, torch.Tensor]]:
    """Copies of every switched tensor (on the device when they fit), else of a sample."""
    free = mem_state(device)["free"]
    if free is None or total < 0.4 * free:
        return "all", {k: t.detach().clone() for k, t in tensors.items()}
    return "sample", {k: t.detach().reshape(-1)[:1 << 20].cpu() for k, t in tensors.items()}


def _identical(mode: str, snap: Mapping[str, torch.Tensor],
               tensors: Mapping[str, torch.Tensor]) -> bool:
    for k, t in tensors.items():
        now = t if mode == "all" else t.detach().reshape(-1)[:1 << 20].cpu()
        if now.shape != snap[k].shape or not torch.equal(_bits(now), _bits(snap[k])):
            return False
    return True


def switch(device: str, options: dict[str, Any], repeats: int, fallback: Path,
           ckpt: Path | None, deadline: float) -> dict[str, Any]:
    res: dict[str, Any] = {"options": options}
    t = time.perf_counter()
    model = build_model(options, device)
    sync(device)
    res["build_s"] = r6(time.perf_counter() - t)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    ids = sample_ids(options, device)
    t = time.perf_counter()
    res["loss"] = round(train_step(model, opt, ids), 4)
    sync(device)
    res["train_step_s"] = r6(time.perf_counter() - t)
    res["params"] = sum(p.numel() for p in model.parameters())
    res.update(state_bytes(model, opt, device))
    with torch.no_grad():
        ref = model(input_ids=ids).logits.detach().clone()
    registry = HostRegistry()
    sw = DeviceSwitch(SwitchJob(model, opt), device, SwitchMode.ON, registry=registry)
    tensors = sw.tensors()
    total = sum(x.numel() * x.element_size() for x in tensors.values())
    res.update(tensors=len(tensors), switch_tensor_bytes=total,
               dtypes=sorted({str(x.dtype).removeprefix("torch.") for x in tensors.values()}))
    specs = [(k, dtype_name(t.dtype), tuple(t.shape)) for k, t in tensors.items()]
    entries, size = plan_layout(specs, DEFAULT_ALIGN_BYTES)
    now = time.time()
    index = SegmentIndex(name="device.gpucheck", version=1, size_bytes=size,
                         align_bytes=DEFAULT_ALIGN_BYTES, tensors=entries, created_s=now,
                         updated_s=now)
    snap_mode, snap = _snapshot(tensors, device, total)
    res["identity_check"] = snap_mode
    directory, kind = host_dir(size, fallback)
    res.update(segment_bytes=size, segment_kind=kind)
    runs: list[dict[str, Any]] = []
    with seg_file(directory, "switch", size) as path:
        storage = map_file(path, size)
        views = tensor_views(storage, index)
        t = time.perf_counter()
        res["registered"] = registry.register(storage)
        res["register_s"] = r6(time.perf_counter() - t)
        try:
            for i in range(repeats):
                if i and time.monotonic() > deadline:
                    res["repeats_cut"] = f"time budget used up after {i} of {repeats}"
                    break
                gc.collect()
                before = mem_state(device)
                out = sw.out(tensors, views, storage)
                after_out = mem_state(device)
                left = sum(x.untyped_storage().nbytes() for x in tensors.values())
                held_out = sw.held_bytes()
                into = sw.into(views, storage)
                after_in = mem_state(device)
                same = _identical(snap_mode, snap, tensors)
                with torch.no_grad():
                    logits = model(input_ids=ids).logits
                runs.append({"out": out.to_json(), "in": into.to_json(),
                             "mem_before": before, "mem_after_out": after_out,
                             "mem_after_in": after_in, "storage_nbytes_after_out": left,
                             "held_bytes_after_out": held_out, "bit_identical": same,
                             "forward_ok": bool(torch.isfinite(logits).all()),
                             "forward_equal": bool(torch.equal(logits, ref))})
                del logits
        finally:
            registry.close()
            del views, storage
    res["runs"] = runs
    if ckpt is not None and time.monotonic() < deadline:   # for the cold section
        t = time.perf_counter()
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, ckpt)
        save_s = time.perf_counter() - t
        res["checkpoint"] = {"path": str(ckpt), "bytes": ckpt.stat().st_size,
                             "save_s": r6(save_s), "cache_drop": drop_cache(ckpt)}
    del model, opt, sw, tensors, snap, ref
    gc.collect()
    if is_cuda(device):
        torch.cuda.empty_cache()
    return res


def _switch_summary(res: dict[str, Any], pinned: Mapping[str, Any] | None) -> None:
    runs = res.get("runs") or []
    if not runs:
        return
    moved = runs[0]["out"]["moved_bytes"]
    out_s = median([r["out"]["seconds"] for r in runs])
    in_s = median([r["in"]["seconds"] for r in runs])
    b, a = runs[0]["mem_before"], runs[0]["mem_after_out"]
    drop = None if b["allocated"] is None else b["allocated"] - a["allocated"]
    res.update(moved_bytes=moved, moved_equals_expected=moved == res["expected_bytes"],
               out_s=r6(out_s), in_s=r6(in_s), out_gb_s=gb_s(moved, out_s),
               in_gb_s=gb_s(moved, in_s),
               bit_identical=all(r["bit_identical"] for r in runs),
               forward_ok=all(r["forward_ok"] for r in runs),
               storage_nbytes_after_out=max(r["storage_nbytes_after_out"] for r in runs),
               allocated_drop_bytes=drop,
               allocated_drop_frac=None if drop is None else round(drop / moved, 4),
               reserved_drop_bytes=None if b["reserved"] is None
               else b["reserved"] - a["reserved"],
               free_gain_bytes=None if b["free"] is None else a["free"] - b["free"])
    if pinned:
        out_f = res["out_gb_s"] / pinned["d2h_gb_s"] if pinned["d2h_gb_s"] else 0.0
        in_f = res["in_gb_s"] / pinned["h2d_gb_s"] if pinned["h2d_gb_s"] else 0.0
        res.update(out_frac_of_pinned=round(out_f, 3), in_frac_of_pinned=round(in_f, 3),
                   goal_frac_of_pinned=GOAL_FRAC_OF_PINNED,
                   meets_frac_goal=min(out_f, in_f) >= GOAL_FRAC_OF_PINNED)


# -- 3. cold start, 4. vLLM -----------------------------------------------------------
def cold(device: str, options: dict[str, Any], checkpoint: Mapping[str, Any] | None,
         timeout_s: float) -> dict[str, Any]:
    if checkpoint is None:
        raise RuntimeError("no checkpoint: the switch section failed or was skipped")
    out, wall = run_child(COLD, [json.dumps(options), checkpoint["path"], device], timeout_s)
    out["stages_s"] = {k: r6(v) for k, v in out["stages_s"].items()}
    out["spawn_to_loaded_s"] = r6(out["spawn_to_loaded_s"])
    out.update(wall_s=r6(wall), checkpoint=dict(checkpoint))
    return out


def vllm(device: str, tmp: Path, timeout_s: float) -> dict[str, Any]:
    model_dir = tmp / "vllm-model"
    model_dir.mkdir()
    res: dict[str, Any] = {"model": make_vllm_model_dir(model_dir)}
    if importlib.util.find_spec("vllm") is None:
        return {**res, "skipped": "vllm is not importable"}
    if not (is_cuda(device) and torch.cuda.is_available()):
        return {**res, "skipped": "vLLM's sleep mode needs a CUDA device"}
    out, wall = run_child(VLLM, [str(model_dir)], timeout_s)
    return {**res, **out, "wall_s": r6(wall)}


# -- report ---------------------------------------------------------------------------
def summary(result: dict[str, Any]) -> dict[str, Any]:
    s = result["sections"]
    sw, cd = s.get("switch", {}), s.get("cold", {})
    out: dict[str, Any] = {k: sw.get(k) for k in (
        "moved_bytes", "expected_bytes", "moved_equals_expected", "out_gb_s", "in_gb_s",
        "out_frac_of_pinned", "in_frac_of_pinned", "meets_frac_goal", "bit_identical",
        "forward_ok", "storage_nbytes_after_out", "allocated_drop_frac")}
    out["goal_frac_of_pinned"] = GOAL_FRAC_OF_PINNED
    cold_s, warm_s = cd.get("spawn_to_loaded_s"), sw.get("in_s")
    ratio = cold_s / warm_s if cold_s and warm_s else None
    out.update(cold_s=cold_s, warm_in_s=warm_s,
               cold_over_warm=None if ratio is None else round(ratio, 1),
               goal_cold_over_warm=GOAL_COLD_OVER_WARM,
               meets_ratio_goal=None if ratio is None else ratio >= GOAL_COLD_OVER_WARM)
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1 << 20:
        return f"{v / (1 << 30):.3f} GiB"
    return str(v)


def table(result: dict[str, Any]) -> Table:
    t = Table(title=f"gpu_check on {result['machine'].get('device_name')} "
                    f"({'dry run, ' if result['dry_run'] else ''}{result['device']})")
    for col in ("section", "measure", "value", "goal"):
        t.add_column(col, justify="left" if col in ("section", "measure") else "right")
    bw = result["sections"].get("bandwidth", {}).get("modes", {})
    for mode, m in bw.items():
        t.add_row("bandwidth", f"{mode} H2D / D2H GB/s", f"{m['h2d_gb_s']} / {m['d2h_gb_s']}",
                  "")
    if "shm_registered" in bw:
        m = bw["shm_registered"]
        t.add_row("bandwidth", "cudaHostRegister (s)", f"{m['register_s']} ({m['registered']})",
                  "")
    sm = result["summary"]
    goals = {"out_frac_of_pinned": f">= {GOAL_FRAC_OF_PINNED}",
             "in_frac_of_pinned": f">= {GOAL_FRAC_OF_PINNED}",
             "cold_over_warm": f">= {GOAL_COLD_OVER_WARM}", "bit_identical": "True",
             "moved_equals_expected": "True", "storage_nbytes_after_out": "0"}
    for k, v in sm.items():
        if not k.startswith("goal_"):
            t.add_row("summary", k, _fmt(v), goals.get(k, ""))
    for name, sec in result["sections"].items():
        if "error" in sec:
            t.add_row(name, "error", sec["error"][:100], "")
        for step, rec in (sec.get("steps") or {}).items():
            t.add_row(name, step, f"{rec['s']} s" if rec["ok"] else rec.get("error", "")[:80],
                      "")
        if "skipped" in sec:
            t.add_row(name, "skipped", sec["skipped"], "")
    for name, why in result["skipped"].items():
        t.add_row(name, "skipped", why, "")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, small sizes (< 1 min)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--size-gib", type=float, default=None,
                   help="bandwidth copy size (default 1; dry run 1/32)")
    p.add_argument("--params-b", type=float, default=None,
                   help="model size, billions of parameters (default 1.0; dry run 0.008)")
    p.add_argument("--repeats", type=int, default=5, help="bandwidth copies (median)")
    p.add_argument("--switch-repeats", type=int, default=3, help="switch out/in (median)")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--skip-cold", action="store_true")
    p.add_argument("--timeout", type=float, default=450.0,
                   help="seconds after which no further section starts")
    p.add_argument("--disk-dir", type=Path, default=Path("/var/tmp"),
                   help="checkpoint of the cold start (not a tmpfs); host fallback")
    p.add_argument("--json", type=Path, default=None, help="output (default bench/results/"
                   "gpu_check.json; dry run gpu_check_dry_run.json)")
    args = p.parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.timeout
    device = "cpu" if args.dry_run else args.device
    size_gib = args.size_gib or (1 / 32 if args.dry_run else 1.0)
    params_b = args.params_b or (0.008 if args.dry_run else 1.0)
    options = llama_options(params_b)
    out_path = args.json or REPO / "bench" / "results" / (
        "gpu_check_dry_run.json" if args.dry_run else "gpu_check.json")
    disk = args.disk_dir if args.disk_dir.is_dir() else Path(tempfile.gettempdir())
    tmp = Path(tempfile.mkdtemp(prefix="weave-gpucheck-", dir=disk))
    result: dict[str, Any] = {
        "bench": "gpu_check", "dry_run": args.dry_run, "device": device,
        "machine": machine_facts(device),
        "config": {"size_bytes": int(size_gib * (1 << 30)), "params_b": params_b,
                   "repeats": args.repeats, "switch_repeats": args.switch_repeats,
                   "timeout_s": args.timeout, "disk_dir": str(disk), "model": options},
        "sections": {}, "skipped": {}, "section_s": {}}

    def section(name: str, fn: Callable[[float], dict[str, Any]]) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            result["skipped"][name] = f"time budget of {args.timeout:g} s used up"
            return
        t = time.monotonic()
        try:
            result["sections"][name] = fn(left)
        except Exception as exc:
            result["sections"][name] = {"error": err(exc),
                                        "traceback": traceback.format_exc()[-2000:]}
        result["section_s"][name] = r6(time.monotonic() - t)

    try:
        if is_cuda(device) and not torch.cuda.is_available():
            raise SystemExit(f"{device}: CUDA is not available (use --dry-run on a CPU host)")
        section("bandwidth", lambda left: bandwidth(
            device, result["config"]["size_bytes"], max(1, args.repeats), disk))
        ckpt = None if args.skip_cold else tmp / "cold.pt"
        section("switch", lambda left: switch(device, options, max(1, args.switch_repeats),
                                              disk, ckpt, deadline))
        _switch_summary(result["sections"].get("switch", {}),
                        result["sections"].get("bandwidth", {}).get("modes", {}).get("pinned"))
        if args.skip_cold:
            result["skipped"]["cold"] = "--skip-cold"
        else:
            section("cold", lambda left: cold(device, options, result["sections"].get(
                "switch", {}).get("checkpoint"), left + 20))
            if ckpt is not None:
                ckpt.unlink(missing_ok=True)
        if args.skip_vllm:
            result["skipped"]["vllm"] = "--skip-vllm"
        else:
            section("vllm", lambda left: vllm(device, tmp, left + 20))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        result["summary"] = summary(result)
        result["elapsed_s"] = r6(time.monotonic() - t_start)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1, default=str))
    Console(width=160).print(table(result))
    print(f"wrote {out_path} ({result['elapsed_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
