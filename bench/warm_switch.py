"""Warm vs cold phase switch on one node, through the real node daemon.

For each state size (GiB of fp32 weights in 64 MiB "layers"), the same job is
activated twice by the daemon, and we time from the ``activate`` request to the end of
the first useful work in the fresh worker (one matmul per layer, i.e. every weight byte
read once):

* warm: the state is resident in /dev/shm; the worker attaches it zero-copy;
* cold: the worker ``torch.load``s a checkpoint file whose page cache was dropped
  (fsync + posix_fadvise DONTNEED, or ``--drop-all-caches``: echo 3 > drop_caches).

Also measured: the daemon's ``restore`` of its own checkpoint into shm (cold disk read).
Both paths pay the same process start and ``import torch``; the table splits that out.

    .venv/bin/python bench/warm_switch.py --sizes 1,4 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

WORKER = r"""
import time
t_start = time.monotonic()
import json, sys
import torch
from weave_slurm.node.worker import attach_from_env
t_imported = time.monotonic()
mode, out = sys.argv[1], sys.argv[2]
if mode == "warm":
    layers = attach_from_env()["weights"].tensors
else:
    layers = torch.load(sys.argv[3], weights_only=True)
t_ready = time.monotonic()
x = torch.ones(layers["layer0000"].shape[1])
acc = 0.0
for name in sorted(layers):
    acc += float((layers[name] @ x)[0])
t_work = time.monotonic()
with open(out, "w") as f:
    json.dump({"t_start": t_start, "t_imported": t_imported, "t_ready": t_ready,
               "t_work": t_work, "acc": acc}, f)
"""


def _make_state(size_gib: float) -> dict[str, torch.Tensor]:
    n_layers = max(1, int(size_gib * (1 << 30)) // LAYER_BYTES)
    rows = LAYER_BYTES // 4 // COLS
    return {f"layer{i:04d}": torch.full((rows, COLS), 1e-3 * (i + 1)) for i in range(n_layers)}


def _run_worker(client: NodeClient, mode: str, out: Path, ckpt: Path,
                timeout_s: float = 900.0) -> dict[str, float]:
    t0 = time.monotonic()
    client.call(Op.ACTIVATE, job="bench", phase="train",
                argv=[sys.executable, "-c", WORKER, mode, str(out), str(ckpt)],
                env={"PYTHONPATH": str(REPO)})
    deadline = t0 + timeout_s
    while True:
        worker = client.call(Op.PHASE, job="bench")["worker"]
        if worker["state"] != "running":
            break
        if time.monotonic() > deadline:
            client.call(Op.DEACTIVATE, job="bench")
            raise RuntimeError(f"{mode} worker did not finish in {timeout_s} s")
        time.sleep(0.01)
    if worker["state"] != "exited":
        log = Path(worker["log_path"]).read_text()[-2000:]
        raise RuntimeError(f"{mode} worker ended {worker['state']}: {log}")
    t = json.loads(out.read_text())
    out.unlink()
    return {"e2e_s": t["t_work"] - t0, "spawn_import_s": t["t_imported"] - t0,
            "state_s": t["t_ready"] - t["t_imported"], "first_work_s": t["t_work"] - t["t_ready"]}


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
               all_caches: bool) -> dict[str, Any]:
    root = shm_parent / f"weave-{size_gib:g}"
    daemon = NodeDaemon(NodeConfig(host_mem_gib=size_gib + 0.5, root=root,
                                   checkpoint_root=disk_dir / "ckpt"))
    daemon.start()
    ready = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(ready,), daemon=True)
    thread.start()
    ready.wait(10)
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
            out = disk_dir / "worker.json"
            warm = _run_worker(client, "warm", out, pt_file)
            how = _drop_cache(pt_file, all_caches)
            cold = _run_worker(client, "cold", out, pt_file)
            pt_file.unlink()
            ckpt = client.call(Op.CHECKPOINT, job="bench")
            daemon.store.delete_job(job)
            restore = client.call(Op.RESTORE, job="bench", drop_cache=True)
            client.call(Op.DROP, job="bench")
    finally:
        daemon.shutdown()
        thread.join(10)
        shutil.rmtree(root, ignore_errors=True)
    return {"size_gib": size_gib, "put_s": put_s, "warm": warm, "cold": cold,
            "cache_drop": how, "checkpoint_save_s": ckpt["elapsed_s"],
            "restore_to_shm_s": restore["elapsed_s"],
            "ratio_e2e": cold["e2e_s"] / warm["e2e_s"],
            "ratio_state": (cold["state_s"] + cold["first_work_s"])
            / (warm["state_s"] + warm["first_work_s"])}


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="warm vs cold phase switch (activate -> first matmul over all weights)")
    for col in ("GiB", "warm e2e s", "warm attach s", "warm 1st work s", "cold e2e s",
                "cold load s", "cold 1st work s", "spawn+import s", "e2e ratio",
                "state ratio", "restore->shm s"):
        table.add_column(col, justify="right")
    for r in rows:
        w, c = r["warm"], r["cold"]
        table.add_row(f"{r['size_gib']:g}", f"{w['e2e_s']:.3f}", f"{w['state_s']:.4f}",
                      f"{w['first_work_s']:.3f}", f"{c['e2e_s']:.3f}", f"{c['state_s']:.3f}",
                      f"{c['first_work_s']:.3f}", f"{w['spawn_import_s']:.3f}",
                      f"{r['ratio_e2e']:.1f}x", f"{r['ratio_state']:.1f}x",
                      f"{r['restore_to_shm_s']:.3f}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4", help="GiB of state, comma separated")
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
            rows.append(bench_size(size, shm_parent, disk, args.drop_all_caches))
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
