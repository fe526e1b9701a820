"""``weave sacct``: usage records of weave jobs, like sacct (docs/accounting.md).

Each job's share of its group's allocations (GPU- and node-hours per pool), its time in
each phase and its share of the group's cost, read from weaved over its socket. A user
sees their own jobs; root and weaved's admin uids see everyone's (``-u`` picks users).
``-S``/``-E`` take sacct's time forms (a subset: :mod:`weave_slurm.cli.timespec`);
without ``-j`` the start defaults to today's midnight, as sacct's does. ``-o`` takes
field names (case does not matter; ``Name%W`` sets a width), ``-p`` prints
``|``-separated lines ending in ``|``, ``-P`` the same without the trailing ``|``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from weave_slurm.cli.selection import Selection, parse_states, split_list
from weave_slurm.cli.timespec import parse_time
from weave_slurm.daemon.client import DaemonClient, default_socket
from weave_slurm.daemon.protocol import Op
from weave_slurm.errors import ConfigError

Row = dict[str, Any]
_H = 3600.0


def _stamp(t: float | None) -> str:
    return "Unknown" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def duration(seconds: float, millis: bool = False) -> str:
    """sacct's ``[D-]HH:MM:SS`` (``millis``: ``MM:SS.mmm`` under an hour, as TotalCPU)."""
    if millis and seconds < _H:
        m, s = divmod(seconds, 60)
        return f"{int(m):02d}:{s:06.3f}"
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def _elapsed(r: Row) -> str:
    if r["started_s"] is None:
        return "00:00:00"
    end = r["ended_s"] if r["ended_s"] is not None else r["now"]
    return duration(max(0.0, end - r["started_s"]))


def _hours(x: float) -> str:
    return f"{x / _H:.4f}"


#: field -> (width, right-justified, cell)
FIELDS: dict[str, tuple[int, bool, Callable[[Row], str]]] = {
    "JobID": (8, False, lambda r: str(r["job"])),
    "JobName": (12, False, lambda r: str(r["name"])),
    "User": (9, False, lambda r: str(r["user"])),
    "UID": (6, True, lambda r: str(r["uid"])),
    "Group": (6, True, lambda r: "" if r["group"] is None else str(r["group"])),
    "State": (10, False, lambda r: str(r["state"])),
    "Account": (10, False, lambda r: r["account"] or ""),
    "QOS": (8, False, lambda r: r["qos"] or ""),
    "Timelimit": (10, True, lambda r: "UNLIMITED" if r["time_limit_min"] is None
                  else duration(60.0 * r["time_limit_min"])),
    "Submit": (19, False, lambda r: _stamp(r["submitted_s"])),
    "Start": (19, False, lambda r: _stamp(r["started_s"])),
    "End": (19, False, lambda r: _stamp(r["ended_s"])),
    "Elapsed": (10, True, _elapsed),
    "SlurmJobIDs": (14, False, lambda r: ",".join(r["slurm_job_ids"])),
    "RolloutGPUHours": (15, True, lambda r: _hours(r["gpu_s"]["rollout"])),
    "TrainGPUHours": (13, True, lambda r: _hours(r["gpu_s"]["train"])),
    "GPUHours": (10, True, lambda r: _hours(sum(r["gpu_s"].values()))),
    "RolloutNodeHours": (16, True, lambda r: _hours(r["node_s"]["rollout"])),
    "TrainNodeHours": (14, True, lambda r: _hours(r["node_s"]["train"])),
    "RolloutTime": (11, True, lambda r: duration(r["phase_s"]["rollout"], True)),
    "SyncTime": (10, True, lambda r: duration(r["phase_s"]["sync"], True)),
    "TrainTime": (10, True, lambda r: duration(r["phase_s"]["train"], True)),
    "Cost": (10, True, lambda r: f"{r['cost']:.4f}"),
}
DEFAULT_FORMAT = ("JobID,JobName,User,Account,State,Elapsed,RolloutGPUHours,TrainGPUHours,"
                  "Cost")
_BY_LOWER = {name.lower(): name for name in FIELDS}


def parse_format(text: str) -> list[tuple[str, int]]:
    """``-o`` as (field, width) pairs; ConfigError naming the bad one and the valid ones."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, _, width = item.partition("%")
        field = _BY_LOWER.get(name.lower())
        if field is None:
            raise ConfigError(f"unknown field {name!r}; valid: {', '.join(FIELDS)}")
        if width and not (width.isdigit() and int(width) > 0):
            raise ConfigError(f"field {item!r}: the width after '%' must be a number > 0")
        out.append((field, int(width) if width else FIELDS[field][0]))
    if not out:
        raise ConfigError(f"no field given; valid: {', '.join(FIELDS)}")
    return out


def render(rows: list[Row], fields: list[tuple[str, int]], *, parsable: str | None = None,
           header: bool = True, currency: str | None = None) -> list[str]:
    """sacct's table (header, dashes, rows) or, with ``parsable`` ('|' or ''), the
    delimited lines (``'|'``: each ends in the delimiter). The table's ``Cost`` header
    names the site's ``currency`` (``Cost(USD)``); parsable headers keep the field names."""
    cells = [[FIELDS[f][2](r) for f, _ in fields] for r in rows]
    if parsable is not None:
        lines = [[f for f, _ in fields]] if header else []
        return ["|".join(line) + parsable for line in lines + cells]

    def fit(text: str, field: str, width: int) -> str:
        text = text if len(text) <= width else text[:width - 1] + "+"
        return text.rjust(width) if FIELDS[field][1] else text.ljust(width)

    out = []
    if header:
        out.append(" ".join(fit(f"Cost({currency})" if f == "Cost" and currency else f, f, w)
                            for f, w in fields).rstrip())
        out.append(" ".join("-" * w for _, w in fields))
    out += [" ".join(fit(c, f, w) for c, (f, w) in zip(row, fields, strict=True)).rstrip()
            for row in cells]
    return out


def _bad(ctx: typer.Context, name: str, exc: ConfigError) -> typer.BadParameter:
    """A usage mistake in option ``name``: one line naming it (exit 2)."""
    param: Any = next((p for p in ctx.command.params if p.name == name), None)
    return typer.BadParameter(str(exc), ctx=ctx, param=param)


def _ids(ctx: typer.Context, jobs: str | None) -> list[int]:
    ids = []
    for part in (p.strip() for p in (jobs or "").split(",")):
        if part:
            if not part.isdigit():
                raise _bad(ctx, "jobs", ConfigError(f"{part!r} is not a job id"))
            ids.append(int(part))
    return ids


def sacct(
    ctx: typer.Context,
    user: Annotated[list[str] | None, typer.Option(
        "--user", "-u", help="Only these users (comma-separated; yours unless admin).")] = None,
    starttime: Annotated[str | None, typer.Option(
        "--starttime", "-S", help="Jobs running at or after this time (default: midnight "
        "today, unless -j).")] = None,
    endtime: Annotated[str | None, typer.Option(
        "--endtime", "-E", help="Jobs running at or before this time (default: now).")] = None,
    jobs: Annotated[str | None, typer.Option("--jobs", "-j", help="Comma-separated ids.")]
    = None,
    fmt: Annotated[str, typer.Option("--format", "-o", help="Fields, comma-separated: "
                                     + ", ".join(FIELDS))] = DEFAULT_FORMAT,
    parsable: Annotated[bool, typer.Option("--parsable", "-p", help="'|'-separated, with "
                                           "a trailing '|'.")] = False,
    parsable2: Annotated[bool, typer.Option("--parsable2", "-P", help="'|'-separated, no "
                                            "trailing '|'.")] = False,
    states: Annotated[list[str] | None, typer.Option(
        "--state", "-s", help="Only jobs in these states (names or codes as sacct: CD, F, "
        "CA, R, PD..., comma-separated).")] = None,
    names: Annotated[list[str] | None, typer.Option(
        "--name", help="Only jobs of these names (comma-separated).")] = None,
    allocations: Annotated[bool, typer.Option(
        "--allocations", "-X", help="As sacct -X: job lines only (weave's records have no "
        "step lines, so this is every line).")] = False,
    no_header: Annotated[bool, typer.Option("--noheader", "-n")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the records as JSON.")]
    = False,
    socket_path: Annotated[Path | None, typer.Option("--socket", help="weaved's socket.")]
    = None,
) -> None:
    """Usage of weave jobs (GPU-hours per pool, phase times, cost share), like sacct."""
    try:
        fields = parse_format(fmt)
    except ConfigError as exc:
        raise _bad(ctx, "fmt", exc) from None
    ids = _ids(ctx, jobs)
    try:
        wanted = Selection(parse_states(states, "--state"), frozenset(),
                           frozenset(split_list(names)))
    except ConfigError as exc:
        raise _bad(ctx, "states", exc) from None
    now = time.time()
    window = {}
    for key, text, param in (("start_s", starttime, "starttime"), ("end_s", endtime, "endtime")):
        if text is not None:
            try:
                window[key] = parse_time(text, now)
            except ConfigError as exc:
                raise _bad(ctx, param, exc) from None
    if "start_s" not in window and not ids:
        window["start_s"] = parse_time("midnight", now)
    users = [u for item in user or [] for u in item.split(",") if u]
    with DaemonClient(default_socket(socket_path)) as client:
        result = client.call(Op.SACCT, users=users, jobs=ids, **window)
    records = [r for r in result["jobs"] if wanted(r)]
    rows = [{**r, "now": result["now"]} for r in records]
    if as_json:
        typer.echo(json.dumps({"jobs": records, "currency": result["currency"],
                               "partitions": result["partitions"]}, indent=1))
        return
    delimiter = "|" if parsable else "" if parsable2 else None
    lines = render(rows, fields, parsable=delimiter, header=not no_header,
                   currency=result.get("currency"))
    if lines:
        typer.echo("\n".join(lines))
