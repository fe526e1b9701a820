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

from weave_slurm.node.client import NodeClient
from weave_slurm.node.daemon import NodeConfig, NodeDaemon
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


def _wait(client: NodeClient, mode: str, timeout_s: float = 900.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        worker: dict[str, Any] = client.call(Op.PHASE, job="bench")["worker"]
        if worker["state"] != "running":
            break
        if time.monotonic() > deadline:
            client.call(Op.DEACTIVATE, job="bench")
            raise RuntimeError(f"{mode} worker did not finish in {timeout_s} s")
        time.sleep(0.002)
    if worker["state"] != "exited":
        log = Path(worker["log_path"]).read_text()[-2000:]
        raise RuntimeError(f"{mode} worker ended {worker['state']}: "
                           f"{worker.get('error')} {log}")
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
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return "fadvise"


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
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",") if s]
    shm_parent = Path(tempfile.mkdtemp(prefix="weave-bench-", dir="/dev/shm"))
    disk = Path(tempfile.mkdtemp(prefix="weave-bench-", dir=args.disk_dir))
    rows = []
    try:
        for size in sizes:
            rows.append(bench_size(size, shm_parent, disk, args.drop_all_caches,
                                   max(1, args.repeats)))
    finally:
        shutil.rmtree(shm_parent, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    Console(width=170).print(_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"bench": "warm_switch", "torch": torch.__version__,
                                         "threads": torch.get_num_threads(), "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
