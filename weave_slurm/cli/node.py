"""``weave node``: run the per-node daemon, or ask it for its status."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from weave_slurm.cli.error_lines import run_app
from weave_slurm.cli.logs import setup_logging
from weave_slurm.errors import ConfigError
from weave_slurm.node.index import DEFAULT_ROOT
from weave_slurm.node.protocol import Op
from weave_slurm.slurm.allocation_watch import (
    DEFAULT_INTERVAL_S,
    AllocationWatch,
    interval_from,
    start_watch,
)

log = logging.getLogger(__name__)
#: How long a stopping node daemon waits for its shutdown (its workers stop) to end.
STOP_JOIN_S = 60.0

node_app = typer.Typer(help="The per-node warm-state daemon.", no_args_is_help=True)


def _node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _per_node(path: Path) -> Path:
    """``{node}`` in a path -> this node's name (``SLURMD_NODENAME``, else the host name):
    one argv serves every node of a step, with no shell to expand variables."""
    text = str(path)
    if "{node}" not in text:
        return path
    node = _node_name()
    if not node or "/" in node or node in (".", ".."):
        raise ConfigError(f"node serve: cannot expand {{node}} in {text!r}: node name "
                          f"{node!r} is not a plain name")
    return Path(text.replace("{node}", node))


@node_app.command()
def serve(
    host_mem_gib: Annotated[float, typer.Option(help="DRAM this node may spend on warm state.")],
    root: Annotated[Path, typer.Option(
        help="Segment store root (a tmpfs); '{node}' becomes $SLURMD_NODENAME.")] = DEFAULT_ROOT,
    socket_path: Annotated[Path | None, typer.Option(
        "--socket", envvar="WEAVE_NODE_SOCKET", help="Default <root>/node.sock")] = None,
    checkpoint_root: Annotated[Path | None, typer.Option(
        help="Default /var/tmp/weave-ckpt; '{node}' as in --root.")] = None,
    keep_checkpoints: Annotated[int, typer.Option(help="Checkpoints kept per job.")] = 2,
    checkpoint_interval_s: Annotated[float, typer.Option(
        help="Periodic checkpoint of each changed job every N s (0 = never).")] = 600.0,
    resident: Annotated[bool, typer.Option(
        help="Keep a zygote and one pre-forked resident worker per job.")] = True,
    listen_port: Annotated[int | None, typer.Option(
        help="Also serve weaved over TCP on this port (0: any free one), munge-"
        "authenticated (weaved on another host); the daemon prints the port it got.")] = None,
    listen_host: Annotated[str, typer.Option(
        help="The address to listen on; default every address of this host.")] = "",
    trusted_uid: Annotated[list[int] | None, typer.Option(
        help="A uid whose munge credential may control this daemon (repeatable; default "
        "0, root).")] = None,
    munge_socket: Annotated[str | None, typer.Option(
        envvar="MUNGE_SOCKET", help="munged's socket; default munge's own.")] = None,
    allocation_watch_s: Annotated[float | None, typer.Option(
        help="Under Slurm ($SLURM_JOB_ID), ask every N s whether that job still runs and "
        "exit once Slurm says it ended (0 = never; default "
        "$WEAVE_NODE_ALLOCATION_WATCH_S, else 30).")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose/--quiet", "-v/-q", help="Log at INFO (default), or warnings only.")] = True,
) -> None:
    """Run the node daemon in the foreground until SIGTERM/SIGINT."""
    from weave_slurm.node.daemon import NodeConfig, NodeDaemon  # no torch (segment_bytes)
    from weave_slurm.node.ending import end_allocation

    setup_logging(logging.INFO if verbose else logging.WARNING, "weave-node", timestamps=True)
    root = _per_node(root)
    checkpoint_root = _per_node(checkpoint_root) if checkpoint_root is not None else None
    socket_path = _per_node(socket_path) if socket_path is not None else None
    daemon = NodeDaemon(NodeConfig(host_mem_gib=host_mem_gib, root=root,
                                   socket_path=socket_path, checkpoint_root=checkpoint_root,
                                   keep_checkpoints=keep_checkpoints,
                                   checkpoint_interval_s=checkpoint_interval_s,
                                   resident_workers=resident, listen_port=listen_port,
                                   listen_host=listen_host,
                                   trusted_uids=tuple(trusted_uid or (0,)),
                                   munge_socket=munge_socket, node_name=_node_name()))
    daemon.start()
    if daemon.door is not None:   # weaved learns the port from this line (node/remote.py)
        from weave_slurm.node.remote import ready_line

        print(ready_line(_node_name(), int(daemon.door.address[1])), flush=True)

    watch: AllocationWatch | None = None

    def _shutdown(ended: str | None) -> None:
        # Slurm signals the zygote and the workers too: none is started again
        if daemon.pool is not None:
            daemon.pool.stopping()
        # A signal under Slurm: the end of the allocation (a returned host's lost steps
        # ended by Slurm), or a stop whose state is wanted again? Slurm says which.
        if ended is None and watch is not None:
            ended = watch.ended_now()
        if ended is not None:
            end_allocation(daemon, ended)
        daemon.shutdown()

    stopping: list[threading.Thread] = []

    def _begin(ended: str | None) -> None:
        thread = threading.Thread(target=_shutdown, args=(ended,), daemon=True)
        stopping.append(thread)
        thread.start()

    def _stop(signum: int, frame: FrameType | None) -> None:
        _begin(None)

    def _allocation_gone(reason: str) -> None:   # the watch knows: no second question
        _begin(reason)

    daemon.on_leave = _allocation_gone   # weaved gives the node back (Op.LEAVE)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    watch = start_watch(os.environ, interval_from(allocation_watch_s, os.environ),
                        _allocation_gone)
    try:
        daemon.serve()
    finally:
        if watch is not None:
            watch.stop()
        # serve returns as soon as the shutdown stops the server: let the shutdown end
        # (workers stopped, the root's files removed) before the process exits
        for thread in list(stopping):
            thread.join(STOP_JOIN_S)


@node_app.command()
def status(
    root: Annotated[Path, typer.Option(help="Segment store root.")] = DEFAULT_ROOT,
    socket_path: Annotated[Path | None, typer.Option(
        "--socket", help="Default <root>/node.sock")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw reply.")] = False,
) -> None:
    """Memory, jobs and weight versions held by the node daemon."""
    from weave_slurm.node.node_client import NodeClient  # imports torch: only when asked

    with NodeClient(socket_path or root / "node.sock") as client:
        reply = client.call(Op.STATUS)
    if as_json:
        typer.echo(json.dumps(reply, indent=1))
        return
    mem = reply["memory"]
    gib = float(1 << 30)
    table = Table(title=f"node {reply['root']}: {mem['used_bytes'] / gib:.2f} of "
                  f"{mem['limit_bytes'] / gib:.2f} GiB used")
    for col in ("JOBID", "UID", "SEGMENT", "VERSION", "GIB", "PHASE", "WORKER", "RESIDENT"):
        table.add_column(col)
    for job in reply["jobs"]:
        worker = job["worker"] or {}
        res = job.get("resident") or {}
        resident = f"{res['worker_state']} pid {res['pid']}" if res else "-"
        for name, seg in job["segments"].items() or [("-", {})]:
            table.add_row(job["job"], str(job["uid"]), name, str(seg.get("version")),
                          f"{seg.get('size_bytes', 0) / gib:.3f}", worker.get("phase", "-"),
                          worker.get("state", "-"), resident)
    Console().print(table)


@node_app.command()
def hold(
    allocation_watch_s: Annotated[float | None, typer.Option(
        help="How often to ask Slurm whether the job still runs (default "
             "$WEAVE_NODE_ALLOCATION_WATCH_S, else 30 s).")] = None,
) -> None:
    """Hold this allocation's nodes: the body of the allocation script weaved submits
    (sbatch_templates/allocation.sbatch). It ends at weaved's scancel, and by itself
    once Slurm says its job ($SLURM_JOB_ID) no longer runs: on a host that was cut off
    and comes back after Slurm ended the job, nothing of the lost allocation stays."""
    setup_logging(logging.INFO, "weave node hold")
    job_id = (os.environ.get("SLURM_JOB_ID") or "").strip()
    if not job_id:
        raise ConfigError("node hold: SLURM_JOB_ID is not set; it runs as the body of an "
                          "allocation's batch script")
    interval = interval_from(allocation_watch_s, os.environ) or DEFAULT_INTERVAL_S
    AllocationWatch(job_id, interval, lambda why: None, who="allocation hold").run()


def main(argv: list[str] | None = None) -> int:
    """``python -m weave_slurm.cli.node`` (weaved's node command); returns the exit code."""
    return run_app(node_app, "weave node", argv)


if __name__ == "__main__":
    sys.exit(main())
