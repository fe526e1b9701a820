"""Start a sync group as real processes, in loopback or across an emulated slow link.

:func:`run_group` writes the scenario, starts one :mod:`weave_slurm.sync.worker` per
rank (training ranks in the training namespace, rollout ranks in the rollout one, or
all of them under ``mpirun`` for the MPI backend), waits with a deadline, and returns
the per-rank results. ``python -m weave_slurm.sync.launch`` is the standalone entry
point used for benchmarking (see ``--help``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weave_slurm.errors import ConfigError
from weave_slurm.sync.errors import SyncError
from weave_slurm.sync.header import SyncMode
from weave_slurm.sync.linkemu import EmulatedLink, LinkSpec
from weave_slurm.sync.scenario import Backend, Method, Scenario
from weave_slurm.vocab import Pool

log = logging.getLogger(__name__)

GRACE_S = 60.0


@dataclass(frozen=True)
class RankOutcome:
    """One rank process: its exit code, its JSON result (None if it wrote none), stderr."""

    rank: int
    returncode: int | None
    result: dict[str, Any] | None
    stderr: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_argv(spec: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "weave_slurm.sync.worker", str(spec), str(results)]


def _spawn_gloo(sc: Scenario, link: EmulatedLink, spec: Path, results: Path
                ) -> list[subprocess.Popen[bytes]]:
    topo = sc.topology()
    master = link.endpoint(Pool.TRAIN)
    port = _free_port() if master.netns is None else random.randint(20000, 60000)
    procs = []
    for info in topo.ranks:
        ep = link.endpoint(info.pool)
        env = {**os.environ, **ep.env(), "WEAVE_SYNC_RANK": str(info.rank),
               "WEAVE_SYNC_INIT": f"tcp://{master.addr}:{port}", "OMP_NUM_THREADS": "1"}
        err = (results / f"rank{info.rank}.err").open("wb")
        procs.append(subprocess.Popen(ep.wrap(_worker_argv(spec, results)), env=env,
                                      stdout=subprocess.DEVNULL, stderr=err))
        err.close()
    return procs


def _spawn_mpi(sc: Scenario, link: EmulatedLink, spec: Path, results: Path
               ) -> list[subprocess.Popen[bytes]]:
    if link.endpoint(Pool.TRAIN).netns is not None:
        raise ConfigError("backend 'mpi' runs in loopback mode only (LinkSpec(rate_mbit=None))")
    n = sc.topology().world_size
    env = {**os.environ, "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
           "OMPI_MCA_oob_tcp_if_include": "lo", "OMP_NUM_THREADS": "1"}
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n),
            *_worker_argv(spec, results)]
    err = (results / "mpirun.err").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    return [proc]


def run_group(sc: Scenario, link: LinkSpec | EmulatedLink, workdir: Path | None = None
              ) -> list[RankOutcome]:
    """Run ``sc`` to completion; one outcome per rank, by rank.

    ``link`` is either a spec (a link is created and removed around the run) or an
    already entered :class:`EmulatedLink` (reused across runs). The whole run is bounded
    by ``len(versions) * timeout_s + GRACE_S``; ranks still alive then are killed.
    """
    if isinstance(link, LinkSpec):
        with EmulatedLink(link) as emu:
            return run_group(sc, emu, workdir)
    with tempfile.TemporaryDirectory(prefix="weave-sync-", dir=workdir) as tmp:
        results = Path(tmp)
        spec = results / "scenario.json"
        sc.dump(spec)
        spawn = _spawn_mpi if sc.backend is Backend.MPI else _spawn_gloo
        procs = spawn(sc, link, spec, results)
        deadline = time.monotonic() + len(sc.versions) * sc.timeout_s + GRACE_S
        codes = [_wait(p, deadline) for p in procs]
        outcomes = []
        for rank in range(sc.topology().world_size):
            res_path, err_path = results / f"rank{rank}.json", results / f"rank{rank}.err"
            if sc.backend is Backend.MPI:
                err_path = results / "mpirun.err"
            code = codes[0] if sc.backend is Backend.MPI else codes[rank]
            outcomes.append(RankOutcome(
                rank, code, json.loads(res_path.read_text()) if res_path.exists() else None,
                err_path.read_text(errors="replace") if err_path.exists() else ""))
        return outcomes


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def write_weights(path: Path, data: torch.Tensor) -> str:
    """Write a flat ``uint8`` weight buffer where worker ranks can attach it."""
    data.numpy().tofile(path)
    return str(path)


def check_outcomes(outcomes: list[RankOutcome]) -> list[dict[str, Any]]:
    """Results of a run that must have succeeded everywhere, else a SyncError with evidence."""
    for o in outcomes:
        if o.result is None or o.returncode != 0:
            tail = o.stderr.strip().splitlines()[-3:]
            raise SyncError(f"sync rank {o.rank} exited {o.returncode} without a result: "
                            f"{' | '.join(tail)}")
        bad = [s for s in o.result["steps"] if not s["ok"]]
        if bad:
            raise SyncError(f"sync rank {o.rank}: {bad[0]['error']}: {bad[0]['message']}")
    return [o.result for o in outcomes if o.result is not None]


def main(argv: list[str] | None = None) -> int:
    """Standalone: sync random weights (one full version, then one delta) and print timings."""
    ap = argparse.ArgumentParser(prog="python -m weave_slurm.sync.launch",
                                 description=main.__doc__)
    ap.add_argument("--train", type=int, default=2, help="training ranks")
    ap.add_argument("--rollout", type=int, default=2, help="rollout ranks")
    ap.add_argument("--mib", type=int, default=64, help="weights, MiB")
    ap.add_argument("--method", choices=[m.value for m in Method], default="twotier")
    ap.add_argument("--mode", choices=["full", "delta"], default="full")
    ap.add_argument("--changed", type=float, default=0.01, help="fraction changed in v2")
    ap.add_argument("--link-mbit", type=int, default=0, help="0 = loopback, no netns")
    ap.add_argument("--backend", choices=[b.value for b in Backend], default="gloo")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    n = args.mib << 20
    with tempfile.TemporaryDirectory(prefix="weave-sync-w-", dir="/dev/shm") as d:
        v1 = torch.randint(0, 256, (n,), dtype=torch.uint8)
        v2 = v1.view(torch.int16).clone()
        idx = torch.randperm(v2.numel())[:int(args.changed * v2.numel())]
        v2[idx] += 1
        files = (write_weights(Path(d) / "v1", v1), write_weights(Path(d) / "v2",
                                                                  v2.view(torch.uint8)))
        sc = Scenario("standalone", args.train, args.rollout, n, files, (1, 2),
                      method=Method(args.method), mode=SyncMode[args.mode.upper()],
                      backend=Backend(args.backend))
        link = LinkSpec(args.link_mbit or None)
        results = check_outcomes(run_group(sc, link))
    for v in range(2):
        steps = [r["steps"][v] for r in results]
        print(json.dumps({"version": v + 1, "time_s": max(s["elapsed_s"] for s in steps),
                          "identical": all(s.get("identical", True) for s in steps),
                          "slow_link_bytes": sum(s["slow_link_bytes"] for s, r in
                                                 zip(steps, results, strict=True)
                                                 if r["pool"] == "train")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
