"""Warm vs cold phase switch on one node, through the real node daemon.

For each state size (GiB of fp32 weights in 64 MiB "layers"), we time from the
``activate`` request to the end of the first useful work (one matmul per layer, i.e.
every weight byte read once), in these ways:

* warm (resident): the job's resident worker (forked by the daemon's zygote at
  register, torch already imported) attaches the segments in /dev/shm zero-copy; the
  median of ``--repeats`` activations after the first (the mapping stays cached);
* warm, first activation: the same worker's first phase (loads the entry module, maps
  the segment, takes the page faults of the first touch);
* warm, fresh process: a new ``python`` started by the daemon attaches the segments
  (the old path: process start + ``import torch`` dominate);
* cold, fresh process: a new ``python`` started by the daemon ``torch.load``s a
  checkpoint file whose page cache was dropped (fsync + posix_fadvise DONTNEED, or
  ``--drop-all-caches``) -- what a reloading system pays;
* cold, load only: the resident worker does the same ``torch.load`` (no process start).

Also measured: the daemon's ``restore`` of its own checkpoint into shm (cold disk read).

Job level (``--only job``, or both by default): the project's reference job
(``builtin:grpo-toy``, a transformers Llama with random weights trained by GRPO),
scaled so that its full train state (policy, reference, Adam moments, RNG and data
position: ``JobRunner.state_tensors()``) is about each size; from ``activate`` to the
first generated token (rollout) or the end of the first forward of the training step
(train), see ``warm_switch_job.py``:

* warm: the job's resident worker (job module imported, runners built, segments
  mapped) installs the state from /dev/shm as the runtime does (rollout: binds the
  ``weights`` segment zero-copy, ``import_weights(..., borrow=True)``; train: copies
  ``state`` into its own memory via ``load_state``: weights, reference and Adam
  moments), then the first work; ``warm copy`` (rollout) copies the weights instead;
  ``warm held`` skips the load (the worker still holds the version, as
  ``hosted/phases.py`` does between its own training phases);
* cold: a fresh process started by the daemon imports torch + transformers + the
  job, builds the model (random init included, as ``LlamaForCausalLM(config)``
  does), reads the job's checkpoint written by the node daemon (page cache dropped
  with fsync + posix_fadvise DONTNEED) and loads it, then the same first work.

A gang (``--only gang``): the warm switch of a 2-rank member (``--gang-ranks``)
against a cold start of the same gang (new workers, process group, model build and
per-rank checkpoint load), measured by ``bench/gang_switch.py`` in a group.

    .venv/bin/python bench/warm_switch.py --sizes 1,4 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from weave_slurm.node.daemon import NodeConfig, NodeDaemon
from weave_slurm.node.node_client import NodeClient
from weave_slurm.node.protocol import Op

LAYER_BYTES = 64 << 20
COLS = 4096
REPO = Path(__file__).resolve().parents[1]

WORK = """
def _work(layers):
    x = torch.ones(layers["layer0000"].shape[1])
    acc = 0.0
    for name in sorted(layers):
        acc += float((layers[name] @ x)[0])
    return acc
"""

# run by a fresh process: python -c WORKER mode out ckpt
WORKER = r"""
import time
t_start = time.monotonic()
import json, sys
import torch
from weave_slurm.node.worker import attach_from_env
t_imported = time.monotonic()
""" + WORK + r"""
mode, out = sys.argv[1], sys.argv[2]
if mode == "warm":
    layers = attach_from_env()["weights"].tensors
else:
    layers = torch.load(sys.argv[3], weights_only=True)
t_ready = time.monotonic()
acc = _work(layers)
t_work = time.monotonic()
with open(out, "w") as f:
    json.dump({"t_start": t_start, "t_imported": t_imported, "t_ready": t_ready,
               "t_work": t_work, "acc": acc}, f)
"""

# entries of the resident worker: called with a PhaseContext, return their timestamps
ENTRY = r"""
import time
import torch
""" + WORK + r"""
def warm(ctx):
    t_ready = time.monotonic()
    acc = _work(ctx.state["weights"].tensors)
    return {"t_ready": t_ready, "t_work": time.monotonic(), "acc": acc}

def cold(ctx):
    t0 = time.monotonic()
    layers = torch.load(ctx.args[0], weights_only=True)
    t_ready = time.monotonic()
    acc = _work(layers)
    t_work = time.monotonic()
    del layers
    return {"t_ready": t_ready, "t_work": t_work, "acc": acc, "t_entry": t0}
"""


def _make_state(size_gib: float) -> dict[str, torch.Tensor]:
    n_layers = max(1, int(size_gib * (1 << 30)) // LAYER_BYTES)
    rows = LAYER_BYTES // 4 // COLS
    return {f"layer{i:04d}": torch.full((rows, COLS), 1e-3 * (i + 1)) for i in range(n_layers)}


def _wait(client: NodeClient, what: str, timeout_s: float = 900.0,
          poll_s: float = 0.002) -> dict[str, Any]:
    """Poll the bench job's phase until it ends; its worker record (error if not exited).
    A job-level run polls slower: polling must not steal the 2 cores from the worker."""
    deadline = time.monotonic() + timeout_s
    while True:
        worker: dict[str, Any] = client.call(Op.PHASE, job="bench")["worker"]
        if worker["state"] != "running":
            break
        if time.monotonic() > deadline:
            client.call(Op.DEACTIVATE, job="bench")
            raise RuntimeError(f"{what} did not finish in {timeout_s} s")
        time.sleep(poll_s)
    if worker["state"] != "exited":
        log = Path(worker["log_path"]).read_text()[-3000:] if worker.get("log_path") else ""
        raise RuntimeError(f"{what} ended {worker['state']}: {worker.get('error')} {log}")
    return worker


def _run_fresh(client: NodeClient, mode: str, out: Path, ckpt: Path) -> dict[str, float]:
    """A new process per activation (the daemon's argv path)."""
    t0 = time.monotonic()
    client.call(Op.ACTIVATE, job="bench", phase="train",
                argv=[sys.executable, "-c", WORKER, mode, str(out), str(ckpt)],
                env={"PYTHONPATH": str(REPO)})
    _wait(client, mode)
    t = json.loads(out.read_text())
    out.unlink()
    return {"e2e_s": t["t_work"] - t0, "spawn_import_s": t["t_imported"] - t0,
            "state_s": t["t_ready"] - t["t_imported"], "first_work_s": t["t_work"] - t["t_ready"]}


def _run_resident(client: NodeClient, entry: str, args: list[str]) -> dict[str, float]:
    """The job's resident worker (the daemon's entry path)."""
    t0 = time.monotonic()
    client.call(Op.ACTIVATE, job="bench", phase="train", entry=entry, args=args)
    w = _wait(client, entry)
    t = w["result"]
    return {"e2e_s": t["t_work"] - t0, "handoff_s": w["t_recv"] - t0,
            "attach_s": w["attach_s"], "state_s": t["t_ready"] - t0,
            "first_work_s": t["t_work"] - t["t_ready"]}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_cache(path: Path, all_caches: bool) -> str:
    if all_caches:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            return "drop_caches"
        except OSError:
            pass
    fadvise_drop(path)
    return "fadvise"


def fadvise_drop(path: Path) -> None:
    """Write ``path`` out and ask the kernel to forget its cached pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bench_size(size_gib: float, shm_parent: Path, disk_dir: Path,
               all_caches: bool, repeats: int) -> dict[str, Any]:
    root = shm_parent / f"weave-{size_gib:g}"
    daemon = NodeDaemon(NodeConfig(host_mem_gib=size_gib + 0.5, root=root,
                                   checkpoint_root=disk_dir / "ckpt",
                                   checkpoint_interval_s=0))
    daemon.start()
    ready = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(ready,), daemon=True)
    thread.start()
    ready.wait(10)
    entry_file = disk_dir / "entry.py"
    entry_file.write_text(ENTRY)
    try:
        with NodeClient(daemon.config.socket, timeout_s=900) as client:
            job = client.register("bench")
            state = _make_state(size_gib)
            t = time.monotonic()
            client.put_state(job, "weights", state, version=1)
            put_s = time.monotonic() - t
            pt_file = disk_dir / "state.pt"
            torch.save(state, pt_file)
            del state
            _fsync(pt_file)  # write-back must not run during the warm measurement
            if daemon.pool is not None:
                daemon.pool.wait_ready()   # zygote + this job's worker (not timed)
            out = disk_dir / "worker.json"
            warm_first = _run_resident(client, f"{entry_file}:warm", [])
            warm_runs = [_run_resident(client, f"{entry_file}:warm", [])
                         for _ in range(repeats)]
            warm = min(warm_runs, key=lambda r: abs(
                r["e2e_s"] - statistics.median(x["e2e_s"] for x in warm_runs)))
            warm_fresh = _run_fresh(client, "warm", out, pt_file)
            how = _drop_cache(pt_file, all_caches)
            cold = _run_fresh(client, "cold", out, pt_file)
            _drop_cache(pt_file, all_caches)
            cold_load = _run_resident(client, f"{entry_file}:cold", [str(pt_file)])
            pt_file.unlink()
            ckpt = client.call(Op.CHECKPOINT, job="bench")
            daemon.store.delete_job(job)
            restore = client.call(Op.RESTORE, job="bench", drop_cache=True)
            client.call(Op.DROP, job="bench")
    finally:
        daemon.shutdown()
        thread.join(10)
        shutil.rmtree(root, ignore_errors=True)
    return {"size_gib": size_gib, "put_s": put_s, "warm": warm, "warm_runs": warm_runs,
            "warm_first": warm_first, "warm_fresh": warm_fresh, "cold": cold,
            "cold_load_only": cold_load, "cache_drop": how,
            "checkpoint_save_s": ckpt["elapsed_s"], "restore_to_shm_s": restore["elapsed_s"],
            "ratio_fresh_cold_vs_warm": cold["e2e_s"] / warm["e2e_s"],
            "ratio_load_only_vs_warm": cold_load["e2e_s"] / warm["e2e_s"],
            "ratio_fresh_cold_vs_warm_first": cold["e2e_s"] / warm_first["e2e_s"]}


# -- job level: the reference GRPO job, activate -> first token / first forward ----------
JOB_FILE = Path(__file__).resolve().with_name("warm_switch_job.py")
VOCAB = 512


def job_options(size_gib: float, threads: int) -> dict[str, Any]:
    """grpo-toy options whose full train state (policy + reference + Adam m, v: 16 B per
    parameter) is about ``size_gib``; head dim 64, intermediate ~2.75x hidden."""
    hidden = max(128, 64 * round(16 * size_gib ** 0.5))
    inter = 64 * round(2.75 * hidden / 64)
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    fixed = 2 * VOCAB * hidden + hidden
    layers = max(1, round((size_gib * (1 << 30) / 16 - fixed) / per_layer))
    return {"vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": inter,
            "num_layers": layers, "num_heads": hidden // 64, "prompts_per_step": 2,
            "group_size": 2, "minibatches": 1, "num_threads": threads}


def _job_resident(client: NodeClient, fn: str, phase: str, args: list[str]) -> dict[str, Any]:
    t0 = time.monotonic()
    client.call(Op.ACTIVATE, job="bench", phase=phase, entry=f"{JOB_FILE}:{fn}", args=args,
                pythonpath=[str(REPO)])
    w = _wait(client, f"{fn} {args[:2]}", 1800.0, 0.02)
    return {"t0": t0, **w}


def _job_warm(client: NodeClient, role: str, mode: str) -> dict[str, float]:
    w = _job_resident(client, "warm", role, [role, mode])
    t, t0 = w["result"], w["t0"]
    return {"e2e_s": t["t_first"] - t0, "handoff_attach_s": t["t_entry"] - t0,
            "attach_s": w["attach_s"], "load_s": t["t_loaded"] - t["t_entry"],
            "first_work_s": t["t_first"] - t["t_loaded"], "cpu_load_s": t["cpu_load_s"],
            "cpu_first_work_s": t["cpu_first_work_s"]}


def _job_cold(client: NodeClient, role: str, ckpt: Path, out: Path,
              options: dict[str, Any]) -> dict[str, float]:
    t0 = time.monotonic()
    client.call(Op.ACTIVATE, job="bench", phase=role,
                argv=[sys.executable, str(JOB_FILE), "cold", role, str(ckpt), str(out),
                      json.dumps(options)], env={"PYTHONPATH": str(REPO)})
    _wait(client, f"cold {role}", 1800.0, 0.02)
    t = json.loads(out.read_text())
    out.unlink()
    return {"e2e_s": t["t_first"] - t0, "spawn_s": t["t_start"] - t0,
            "spawn_import_s": t["t_imported"] - t0, "build_s": t["t_built"] - t["t_imported"],
            "read_s": t["t_read"] - t["t_built"], "load_s": t["t_loaded"] - t["t_built"],
            "first_work_s": t["t_first"] - t["t_loaded"], "cpu_total_s": t["cpu_total_s"],
            "cpu_first_work_s": t["cpu_first_work_s"]}


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    mid = statistics.median(r["e2e_s"] for r in runs)
    return min(runs, key=lambda r: abs(r["e2e_s"] - mid))


def bench_job(size_gib: float, shm_parent: Path, disk_dir: Path, repeats: int,
              threads: int) -> dict[str, Any]:
    """Warm and cold phase switches of the reference job; returns one row per role."""
    options = job_options(size_gib, threads)
    root = shm_parent / f"job-{size_gib:g}"
    daemon = NodeDaemon(NodeConfig(host_mem_gib=1.5 * size_gib + 0.5, root=root,
                                   checkpoint_root=disk_dir / "job-ckpt",
                                   checkpoint_interval_s=0, keep_checkpoints=1))
    daemon.start()
    ready = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(ready,), daemon=True)
    thread.start()
    ready.wait(10)
    out = disk_dir / "cold.json"
    load_seen = [os.getloadavg()[0]]   # other users of the machine, for the record
    try:
        with NodeClient(daemon.config.socket, timeout_s=1800) as client:
            client.register("bench")
            if daemon.pool is not None:
                daemon.pool.wait_ready()   # zygote + this job's worker (not timed)
            init = _job_resident(client, "init", "train", [json.dumps(options)])["result"]
            ckpt = client.call(Op.CHECKPOINT, job="bench")
            ckpt_dir = Path(ckpt["path"])
            roles: dict[str, dict[str, Any]] = {}
            for role in ("rollout", "train"):
                first = _job_warm(client, role, "load")
                runs = [_job_warm(client, role, "load") for _ in range(repeats)]
                held = _median_run([_job_warm(client, role, "held") for _ in range(repeats)])
                roles[role] = {"warm_first": first, "warm_runs": runs,
                               "warm": _median_run(runs), "warm_held": held}
                if role == "rollout":   # the pre-zero-copy path, for comparison
                    roles[role]["warm_copy"] = _median_run(
                        [_job_warm(client, role, "copy") for _ in range(repeats)])
            load_seen.append(os.getloadavg()[0])
            _job_resident(client, "release", "train", [])
            for role in ("rollout", "train"):
                for seg in ckpt_dir.glob("*.seg"):
                    _drop_cache(seg, all_caches=False)
                roles[role]["cold"] = _job_cold(client, role, ckpt_dir, out, options)
            client.call(Op.DROP, job="bench")
            load_seen.append(os.getloadavg()[0])
    finally:
        daemon.shutdown()
        thread.join(10)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(disk_dir / "job-ckpt", ignore_errors=True)
    rows = []
    for role, r in roles.items():
        warm, cold = r["warm"], r["cold"]
        # the switch alone (the paper's 135.8 s vs 1.9 s): everything before the first work
        warm_switch = warm["e2e_s"] - warm["first_work_s"]
        cold_switch = cold["e2e_s"] - cold["first_work_s"]
        rows.append({"size_gib": size_gib, "state_gib": init["state_bytes"] / (1 << 30),
                     "params": init["params"], "role": role, "options": options,
                     "init": init, "checkpoint_save_s": ckpt["elapsed_s"], **r,
                     "loadavg_1min": load_seen,
                     "warm_switch_s": warm_switch, "cold_switch_s": cold_switch,
                     "ratio_cold_vs_warm": cold["e2e_s"] / warm["e2e_s"],
                     "ratio_cold_no_build_vs_warm":
                         (cold["e2e_s"] - cold["build_s"]) / warm["e2e_s"],
                     "ratio_cold_vs_warm_held": cold["e2e_s"] / r["warm_held"]["e2e_s"],
                     "ratio_switch_only": cold_switch / warm_switch})
    return {"rows": rows}


def _job_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="reference job (grpo-toy): activate -> first token (rollout) / "
                        "first forward (train), seconds")
    for col in ("state GiB", "params", "phase", "warm", "warm 1st", "warm copy", "warm held",
                "w: handoff+attach", "w: load", "w: 1st work", "cold", "c: spawn+import",
                "c: build", "c: read ckpt", "c: read+load", "c: 1st work", "cold / warm",
                "cold-build / warm", "switch only"):
        table.add_column(col, justify="right")
    for r in rows:
        w, c = r["warm"], r["cold"]
        table.add_row(f"{r['state_gib']:.2f}", f"{r['params'] / 1e6:.0f}M", r["role"],
                      f"{w['e2e_s']:.3f}", f"{r['warm_first']['e2e_s']:.3f}",
                      f"{r['warm_copy']['e2e_s']:.3f}" if "warm_copy" in r else "-",
                      f"{r['warm_held']['e2e_s']:.3f}", f"{w['handoff_attach_s'] * 1e3:.1f} ms",
                      f"{w['load_s']:.3f}", f"{w['first_work_s']:.3f}", f"{c['e2e_s']:.2f}",
                      f"{c['spawn_import_s']:.2f}", f"{c['build_s']:.2f}",
                      f"{c['read_s']:.2f}", f"{c['load_s']:.2f}", f"{c['first_work_s']:.3f}",
                      f"{r['ratio_cold_vs_warm']:.1f}x",
                      f"{r['ratio_cold_no_build_vs_warm']:.1f}x",
                      f"{r['ratio_switch_only']:.1f}x")
    return table


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="phase switch: activate -> end of first matmul over all weights (s)")
    for col in ("GiB", "warm", "warm 1st", "handoff+attach", "warm fresh proc",
                "cold fresh proc", "spawn+import", "cold load only", "fresh cold / warm",
                "load only / warm", "restore->shm"):
        table.add_column(col, justify="right")
    for r in rows:
        w, c = r["warm"], r["cold"]
        table.add_row(f"{r['size_gib']:g}", f"{w['e2e_s']:.3f}",
                      f"{r['warm_first']['e2e_s']:.3f}", f"{w['state_s'] * 1e3:.2f} ms",
                      f"{r['warm_fresh']['e2e_s']:.3f}", f"{c['e2e_s']:.3f}",
                      f"{c['spawn_import_s']:.3f}", f"{r['cold_load_only']['e2e_s']:.3f}",
                      f"{r['ratio_fresh_cold_vs_warm']:.1f}x",
                      f"{r['ratio_load_only_vs_warm']:.1f}x", f"{r['restore_to_shm_s']:.3f}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4", help="GiB of state, comma separated")
    parser.add_argument("--repeats", type=int, default=3, help="warm activations (median)")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--disk-dir", type=Path, default=Path("/var/tmp"),
                        help="where the cold checkpoint files go (not a tmpfs)")
    parser.add_argument("--drop-all-caches", action="store_true",
                        help="echo 3 > /proc/sys/vm/drop_caches (affects the whole host)")
    parser.add_argument("--only", choices=("all", "micro", "job", "gang"), default="all",
                        help="micro: the matmul microbench; job: the reference-job switch; "
                             "gang: a multi-rank member's switch (bench/gang_switch.py)")
    parser.add_argument("--gang-ranks", type=int, default=2, help="--only gang: its ranks")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads of the job's workers (warm and cold alike)")
    args = parser.parse_args(argv)
    if args.only == "gang":
        from gang_switch import main as gang_main  # bench/ is on sys.path as the script's dir

        return gang_main(["--ranks", str(args.gang_ranks),
                          *(["--json", str(args.json)] if args.json else [])])
    try:
        sizes = [float(s) for s in args.sizes.split(",") if s]
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r} is not a comma-separated list of GiB")
    if not sizes or min(sizes) <= 0:
        parser.error(f"--sizes: {args.sizes!r}: give one or more sizes > 0 (GiB)")
    shm_parent = Path(tempfile.mkdtemp(prefix="weave-bench-", dir="/dev/shm"))
    disk = Path(tempfile.mkdtemp(prefix="weave-bench-", dir=args.disk_dir))
    rows: list[dict[str, Any]] = []
    job_rows: list[dict[str, Any]] = []
    try:
        for size in sizes:
            if args.only in ("all", "micro"):
                rows.append(bench_size(size, shm_parent, disk, args.drop_all_caches,
                                       max(1, args.repeats)))
            if args.only in ("all", "job"):
                job_rows.extend(bench_job(size, shm_parent, disk, max(1, args.repeats),
                                          args.threads)["rows"])
    finally:
        shutil.rmtree(shm_parent, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    console = Console(width=220)
    if rows:
        console.print(_table(rows))
    if job_rows:
        console.print(_job_table(job_rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bench": "warm_switch", "torch": torch.__version__,
                                         "threads": torch.get_num_threads(), "rows": rows,
                                         "job_rows": job_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
