"""``weave status | groups | cancel | show``: the user's view of weaved, squeue-style.

``weave status -o`` takes squeue-like ``%[.][width]code`` fields ('.' right-justifies)
or a preset name; codes: %i JOBID (``ARRAYID_TASK`` for an array element), %F
ARRAY_JOB_ID and %K ARRAY_TASK_ID (N/A outside an array, as squeue), %u USER, %U UID, %j
NAME, %g GROUP, %p PHASE, %I ITER, %s SLOWDOWN/SLO, %w STALE/WIN (versions behind /
window), %T STATE, %t ST, %M TIME, %D NODE COUNT, %N NODES, %R NODELIST(REASON) (the
nodes of a job that has them, else its reason in parentheses, as squeue), %A
SLURM_JOBIDS (its allocations' Slurm job ids), %L LAYOUT (training ranks / rollout
engines per node, GPUs per engine), %o SOLO (``solo``: it runs alone, ``weave-sbatch
--solo``; in the long preset), %r REASON. SLOWDOWN is the member's iteration time over
its solo iteration time; a member faster than its solo estimate shows ``<1:r`` (r the
ratio: no slowdown). The job filters and ``-S`` are squeue's (``cli/selection.py``).
Errors are one line and an exit code, like scancel's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from weave_slurm.cli.selection import selection, sort_rows, users_of
from weave_slurm.daemon.client import DaemonClient, default_socket
from weave_slurm.daemon.protocol import Op
from weave_slurm.daemon.states import JobState
from weave_slurm.errors import ConfigError
from weave_slurm.slurm import hostlist

PRESETS = {
    "default": "%.6i %.9u %.16j %.5g %.7p %.7I %.13s %.2t %.10M %R",
    "long": "%.6i %.9u %.16j %.5g %.4o %.7p %.7I %.13s %.9w %.10T %.10M %.5D %N %A %L %r",
    "short": "%.6i %.9u %.16j %.2t %.10M",
    "ids": "%i",
}
_FIELD = re.compile(r"%([.-]?)(\d*)([a-zA-Z%])")


def _clock(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    hms = f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else hms


def ratio(sd: float | None) -> str:
    """A slowdown as shown: ``1.25``; ``<1:0.93`` for a member faster than its solo
    estimate (no slowdown: the ratio, said to be below 1); ``-`` unknown."""
    if sd is None:
        return "-"
    return f"<1:{sd:.2f}" if sd < 0.995 else f"{sd:.2f}"


def _slowdown(j: dict[str, Any]) -> str:
    """Live (measured) slowdown against the SLO; a trailing '!' when it is violated."""
    over = "!" if j.get("slo_ok") is False else ""
    return f"{ratio(j.get('slowdown'))}/{j['slo']:.2f}{over}"


def _shown(j: dict[str, Any]) -> str:
    """The id squeue shows: ``ARRAYID_TASK`` for an array element, else the job id."""
    return str(j.get("id") or j["job"])


def _nodes_or_reason(j: dict[str, Any]) -> str:
    """squeue's NODELIST(REASON): the nodes, else ``(reason)``."""
    if j["nodes"]:
        return hostlist.compress(j["nodes"])
    return f"({j['reason']})" if j["reason"] else "-"


def _times(per_node: list[int]) -> str:
    return f"{len(per_node)}x{per_node[0]}" if len(set(per_node)) == 1 \
        else "+".join(map(str, per_node))


def layout_cell(j: dict[str, Any]) -> str:
    """``16r/2x8,8e/2x4,tp2``: 16 training ranks as 2 nodes x 8, 8 rollout engines as
    2 nodes x 4, each engine over 2 GPUs (tensor parallel); ``-`` if none stored. A
    trailing ``*``: the runtime starts only part of it (``layout.runs``
    in ``weave show job``)."""
    lay = j.get("layout")
    if not lay:
        return "-"
    t, r = lay["train"], lay["rollout"]
    return (f"{t['ranks']}r/{_times(t['ranks_per_node'])},"
            f"{r['engines']}e/{_times(r['engines_per_node'])},tp{r['engine_gpus']}"
            f"{'*' if lay.get('runs') else ''}")


CODES: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "i": ("JOBID", _shown),   # an array element: ID_TASK
    # squeue's array columns: an element's array job id and task id (else its own id
    # and N/A, as squeue shows a job outside an array)
    "F": ("ARRAY_JOB_ID", lambda j: _shown(j).split("_")[0]),
    "K": ("ARRAY_TASK_ID", lambda j: _shown(j).partition("_")[2] or "N/A"),
    "u": ("USER", lambda j: str(j["user"])),
    "U": ("UID", lambda j: str(j["uid"])),
    "A": ("SLURM_JOBIDS", lambda j: ",".join(j.get("slurm_job_ids") or []) or "-"),
    "j": ("NAME", lambda j: str(j["name"])),
    "g": ("GROUP", lambda j: "-" if j["group"] is None else str(j["group"])),
    "p": ("PHASE", lambda j: str(j["phase"])),
    "I": ("ITER", lambda j: "-" if j["iter"] is None else str(j["iter"])),
    "s": ("SLOWDOWN/SLO", _slowdown),
    "T": ("STATE", lambda j: str(j["state"])),
    "t": ("ST", lambda j: JobState(j["state"]).short),
    "M": ("TIME", lambda j: _clock(float(j["time_s"]))),
    "D": ("NODES", lambda j: str(len(j["nodes"]))),
    "N": ("NODELIST", lambda j: hostlist.compress(j["nodes"]) or "-"),
    "r": ("REASON", lambda j: str(j["reason"] or "-")),
    "R": ("NODELIST(REASON)", _nodes_or_reason),
    "L": ("LAYOUT", layout_cell),
    "o": ("SOLO", lambda j: "solo" if j.get("solo") else "-"),   # weave-sbatch --solo
    # Bounded staleness: the declared window k and how many versions behind the last
    # trained batch's weights were (0 for on-policy jobs).
    "w": ("STALE/WIN", lambda j: f"{'-' if j.get('staleness') is None else j['staleness']}"
          f"/{j.get('window', 0)}"),
}


def format_rows(jobs: list[dict[str, Any]], fmt: str, header: bool = True) -> list[str]:
    """squeue-like lines for ``jobs`` (``fmt``: a preset name or %-codes)."""
    fmt = PRESETS.get(fmt, fmt)
    fields = list(_FIELD.finditer(fmt))
    if not fields:
        raise ConfigError(f"--format {fmt!r}: no %-codes; presets: {', '.join(PRESETS)}")
    for m in fields:
        if m.group(3) not in CODES and m.group(3) != "%":
            raise ConfigError(f"--format: unknown code %{m.group(3)}; valid: "
                              f"{' '.join('%' + c for c in CODES)}")

    def line(cell: Callable[[str], str]) -> str:
        out, pos = [], 0
        for m in fields:
            out.append(fmt[pos:m.start()])
            text = "%" if m.group(3) == "%" else cell(m.group(3))
            width = int(m.group(2)) if m.group(2) else 0
            if width:
                text = text[:width].rjust(width) if m.group(1) == "." else text[:width].ljust(width)
            out.append(text)
            pos = m.end()
        out.append(fmt[pos:])
        return "".join(out).rstrip()

    lines = [line(lambda c: CODES[c][0])] if header else []
    return lines + [line(lambda c, j=j: CODES[c][1](j)) for j in jobs]  # type: ignore[misc]


_Socket = Annotated[Path | None, typer.Option("--socket", help="weaved's socket.")]


def _call(socket_path: Path | None, op: Op, **args: Any) -> dict[str, Any]:
    with DaemonClient(default_socket(socket_path)) as client:
        return client.call(op, **args)


_Names = Annotated[list[str] | None, typer.Option("--name", "-n", help="Only jobs of "
                                                  "these names (comma-separated).")]
_States = Annotated[list[str] | None, typer.Option(
    "--states", "-t", help="Only jobs in these states: names or ST codes, comma-separated, "
    "or all.")]
_Users = Annotated[list[str] | None, typer.Option("--user", "-u", help="Only these users "
                                                  "(comma-separated).")]
_Me = Annotated[bool, typer.Option("--me", help="Only your own jobs.")]


def status(
    user: _Users = None,
    jobs: Annotated[str | None, typer.Option("--jobs", "-j", help="Comma-separated ids.")]
    = None,
    states: _States = None,
    partition: Annotated[list[str] | None, typer.Option(
        "--partition", "-p", help="Only jobs with an allocation in these partitions.")]
    = None,
    name: _Names = None,
    mine: _Me = False,
    sort: Annotated[str | None, typer.Option("--sort", "-S", help="Sort keys: format "
                                             "letters, comma-separated, each with + or -.")]
    = None,
    fmt: Annotated[str, typer.Option("--format", "-o", help="%-codes or a preset: "
                                     + ", ".join(PRESETS))] = "default",
    long: Annotated[bool, typer.Option("--long", "-l", help="The long preset.")] = False,
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Include ended jobs.")] = False,
    no_header: Annotated[bool, typer.Option("--noheader", "-h")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval_s: Annotated[float, typer.Option("--interval", help="Seconds between "
                                              "refreshes.")] = 2.0,
    iterate_s: Annotated[float | None, typer.Option(
        "--iterate", "-i", min=0.0, help="As squeue -i: refresh every SECONDS until Ctrl-C "
        "(--watch --interval SECONDS).")] = None,
    iterations: Annotated[int, typer.Option("--iterations", hidden=True)] = 0,
    socket_path: _Socket = None,
) -> None:
    """Jobs known to weaved, like squeue."""
    if iterate_s is not None:
        watch, interval_s = True, iterate_s
    ids = _ids(jobs)
    users = users_of(user, mine)
    sel = selection(states, partition, name)
    if long:
        fmt = "long"
    format_rows([], fmt)          # a bad --format is refused before weaved is asked
    sort_rows([], sort)           # and so is a bad --sort
    shown = 0
    while True:
        result = _call(socket_path, Op.STATUS, users=users, jobs=ids,
                       all=show_all or sel.wants_ended, **sel.request())
        for warning in result.get("warnings") or []:
            typer.echo(f"weave: warning: {warning}", err=True)
        rows = sort_rows(result["jobs"], sort)
        if as_json:
            typer.echo(json.dumps(rows, indent=1))
        else:
            if watch:
                typer.echo("\x1b[H\x1b[2J" + time.strftime("%a %b %d %H:%M:%S %Y"))
            typer.echo("\n".join(format_rows(rows, fmt, not no_header)))
        shown += 1
        if not watch or (iterations and shown >= iterations):
            return
        time.sleep(interval_s)


def _ids(jobs: str | None) -> list[int]:
    ids = []
    for part in (jobs or "").split(","):
        if part.strip():
            if not part.strip().isdigit():
                raise ConfigError(f"--jobs: {part.strip()!r} is not a job id")
            ids.append(int(part))
    return ids


def groups(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    socket_path: _Socket = None,
) -> None:
    """Co-execution groups: members, pools, allocation ids, bubbles."""
    result = _call(socket_path, Op.GROUPS)
    if as_json:
        typer.echo(json.dumps(result["groups"], indent=1))
        return
    # the site's partitions name the pools (a weaved before 0.1 did not send them)
    pools = result.get("partitions") or {"rollout": "rollout", "train": "train"}
    r, t = (str(pools[k]).upper() for k in ("rollout", "train"))
    rw, tw = max(3, len(r)), max(4, len(t))
    bw, btw = max(7, len(r) + 4), max(8, len(t) + 4)
    head = f"{'GROUP':>5} {'STATE':>8} {'MEMBERS':<16} {r:>{rw}} {t:>{tw}} {'PERIOD_S':>8} " \
           f"{'BUB_' + r:>{bw}} {'BUB_' + t:>{btw}} ALLOCATIONS"
    lines = [head]
    for g in result["groups"]:
        allocs = ",".join(f"{a['id'] or '?'}({a['partition']}:{a['state'].lower()})"
                          for a in g["allocations"]) or "-"
        members = ",".join([*(f"{j}>" if j in g.get("moving_out", []) else str(j)
                              for j in g["members"]),
                            *(f">{j}" for j in g.get("moving_in", []))]) or "-"
        # a pool: its GPUs (shares of nodes), not a node count
        rollout = f"{g['pool_gpus']}g" if g.get("pool_gpus") else str(g["rollout_nodes"])
        lines.append(
            f"{g['group']:>5} {g['state']:>8} {members:<16} "
            f"{rollout:>{rw}} {g['train_nodes']:>{tw}} "
            f"{_num(g['period_s'], '.0f'):>8} {share(g['rollout_bubble']):>{bw}} "
            f"{share(g['train_bubble']):>{btw}} {allocs}")
    typer.echo("\n".join(lines))


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def share(x: float | None) -> str:
    """A fraction as a whole percentage, never ``-0%`` (an idle share computed as
    ``1 - busy`` can come out a hair below zero)."""
    return "-" if x is None else f"{max(0.0, x):.0%}"


#: weave cancel's exit code when a job id is unknown or not the caller's (as scancel).
CANCEL_FAILED = 1


def cancel(
    job_ids: Annotated[list[str] | None, typer.Argument(
        help="Job ids (an array's id: all its elements; ID_TASK: one element).")] = None,
    user: _Users = None,
    name: _Names = None,
    states: _States = None,
    mine: _Me = False,
    socket_path: _Socket = None,
) -> None:
    """Cancel jobs, like scancel (exit 1 if any id is unknown or foreign; quiet about jobs
    that have ended).

    With ``-u``, ``-n`` or ``-t`` the jobs are those that match every filter (and are
    among the ids, if any are given); without ``-u``, only your own jobs."""
    sel = selection(states, None, name)
    ids, whole = _cancel_ids(socket_path, job_ids or [])
    if not sel.empty or user or mine:
        # without -u only the caller's own jobs (root too: never another user's by a
        # name or a state alone)
        rows = _call(socket_path, Op.STATUS, users=users_of(user, mine or not user),
                     jobs=ids, all=False)["jobs"]
        ids, whole = [int(j["job"]) for j in rows if sel(j)], False
        if not ids:
            return                             # as scancel: no job matched, nothing to do
    elif not ids:
        raise ConfigError("cancel: no job id and no filter (-u, -n, -t, --me): "
                          "name the jobs to cancel")
    result = _call(socket_path, Op.CANCEL, jobs=ids, arrays=whole)
    # as scancel: quiet about jobs that had ended; one line per other failure, exit 1
    failed = [r for r in result["results"] if not r["ok"] and not r.get("ended")]
    for r in failed:
        typer.echo(f"weave cancel: error: {r['message']}", err=True)
    if failed:
        raise typer.Exit(CANCEL_FAILED)


def _cancel_ids(socket_path: Path | None, words: list[str]) -> tuple[list[int], bool]:
    """The job ids ``weave cancel`` names, and whether an array's id means all its
    elements (not when an ``ID_TASK`` names one of them, as scancel's)."""
    ids: list[tuple[int, str]] = []
    tasks: list[tuple[int, str]] = []
    for word in words:
        head, sep, task = word.partition("_")
        if not head.isdigit() or (sep and not task.isdigit()):
            raise typer.BadParameter(f"{word!r} is not a job id: an integer ID, or ID_TASK "
                                     "for one element of an array", param_hint="JOB_IDS")
        (tasks if sep else ids).append((int(head), word))
    if tasks:
        rows = _call(socket_path, Op.STATUS, jobs=sorted({h for h, _ in tasks}),
                     all=True)["jobs"]
        by_id = {str(r.get("id")): int(r["job"]) for r in rows}
        for _, word in tasks:
            if word not in by_id:
                raise ConfigError(f"cancel: no array element {word}")
        return [h for h, _ in ids] + [by_id[w] for _, w in tasks], not tasks
    return [h for h, _ in ids], True


def show(
    kind: Annotated[str, typer.Argument(help="job or group")],
    ident: Annotated[int, typer.Argument(help="Its id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    socket_path: _Socket = None,
) -> None:
    """Details of one job (your own, unless admin) or group, like scontrol show."""
    result = _call(socket_path, Op.SHOW, kind=kind, id=ident)
    if as_json:
        typer.echo(json.dumps(result, indent=1))
        return
    slurm_ids = result.pop("slurm_job_ids", None)   # the Slurm jobs of its allocations
    if "weights_sha256_why" in result:   # no digest of its final weights: why, in words
        result["weights_sha256"] = f"({result.pop('weights_sha256_why')})"
    for key, value in result.items():
        if key in ("transitions", "steps", "allocations", "profile", "spec", "runtime",
                   "planning_profile", "layout", "requeue_history"):
            continue
        typer.echo(show_pair(key, value))
    for line in layout_lines(result.get("layout")):
        typer.echo(line)
    if slurm_ids is not None:
        typer.echo(f"SlurmJobIds={','.join(slurm_ids) or '(null)'}")
    for line in _runtime_lines(result.get("runtime")):
        typer.echo(line)
    for name in ("profile", "planning_profile"):
        p = result.get(name)
        if p:
            typer.echo(f"{name}=rollout {p['rollout_mean_s']:.3f}/{p['rollout_max_s']:.3f}s "
                       f"train {p['train_mean_s']:.3f}/{p['train_max_s']:.3f}s (mean/max) "
                       f"state {p['rollout_state_gib']:.3g}/{p['train_state_gib']:.3g} GiB "
                       "(rollout/train node)")
    for a in result.get("allocations", []):
        typer.echo(f"allocation={a['id']} {a['partition']} {a['state']} "
                   f"nodes={hostlist.compress(a['nodes']) or '-'}")
    for s in result.get("steps", []):
        typer.echo(f"step={s['name']} {s['state']} {s['reason']}")
    for r in result.get("requeue_history", []):   # why it was requeued, each time
        typer.echo(f"requeued={time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(r['ts']))} "
                   f"{r['reason']}")
    for t in result.get("transitions", []):
        typer.echo(f"transition={time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(t['ts']))} "
                   f"{t['src'] or '-'}->{t['dst']} {t['reason']}")


#: Keys of ``show`` that are points in time (printed as local dates, like scontrol's
#: SubmitTime) and durations (printed as [D-]HH:MM:SS, like its RunTime).
_WHEN = {"submitted_s", "started_s", "ended_s", "created_s"}
_HOW_LONG = {"time_s"}


def show_pair(key: str, value: Any) -> str:
    """One ``key=value`` of ``weave show``, its times as dates and durations as clocks."""
    if key in _WHEN:
        when = "(null)" if value is None else \
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(float(value)))
        return f"{key[:-2]}={when}"
    if key in _HOW_LONG:
        return f"{key[:-2]}={_clock(float(value or 0.0))}"
    if key == "slowdown":
        return f"slowdown={ratio(value)}"
    if key == "nodes" and isinstance(value, list):
        return f"nodes={hostlist.compress(value) or '(null)'}"
    return f"{key}={'(null)' if value is None else value}"   # as scontrol shows none


def layout_lines(lay: dict[str, Any] | None) -> list[str]:
    """A job's layout for ``weave show job``: which nodes hold which ranks and engines."""
    if not lay:
        return []

    def span(pair: list[int]) -> str:
        return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}-{pair[1]}"

    t, r = lay["train"], lay["rollout"]
    lines = [f"layout={lay['words']}",
             "layout.train=" + " ".join(f"{n['node'] or '?'}:ranks={span(n['ranks'])}"
                                        for n in t["nodes"]),
             "layout.rollout=" + " ".join(f"{n['node'] or '?'}:engines={span(n['engines'])}"
                                          for n in r["nodes"])
             + f" gpus_per_engine={r['engine_gpus']}"]
    if lay.get("runs"):
        lines.append(f"layout.runs={lay['runs']}")
    if lay.get("pooling"):   # may a pooled group spread its rollout over any width
        lines.append(f"layout.pooling={lay['pooling']}")
    return lines


def _stats(xs: list[float]) -> str:
    if not xs:
        return "-"
    ys = sorted(xs)
    return f"n={len(ys)} median={ys[len(ys) // 2]:.3f}s max={ys[-1]:.3f}s"


def _runtime_lines(rt: dict[str, Any] | None) -> list[str]:
    """The group runtime's view of a job: the four measured quantities and drift."""
    if not rt:
        return []
    version = "-" if rt["version"] is None else rt["version"]   # unknown while restoring
    lines = [f"runtime=member {rt['member_state']} version={version}/"
             f"{rt['iterations']} node={rt.get('node') or '-'} "
             f"recoveries={rt['recoveries']} error={rt.get('error') or '-'}"]
    if rt.get("event"):   # its last fault and what was done about it, in words
        lines.append(f"runtime.event={rt['event']}")
    m = rt.get("measured") or {}
    if m:
        sync = ",".join(f"{k}:{v}" for k, v in sorted(m["sync_bytes"].items())) or "-"
        lines += [f"measured.rollout_time={_stats(m['rollout_s'])}",
                  f"measured.train_time={_stats(m['train_s'])}",
                  f"measured.state_bytes=rollout:{m['rollout_state_bytes']} "
                  f"train:{m['train_state_bytes']}",
                  f"measured.sync_bytes={sync} sync_time={_stats(m['sync_s'])}",
                  f"measured.slowdown={_num(m['slowdown'], '.2f')} slo={_num(m['slo'], '.2f')}"
                  f" slo_ok={m['slo_ok']}"]
    drift = rt.get("drift") or []
    lines.append(f"drift={','.join(drift) if drift else 'none'}")
    return lines


def mount(app: typer.Typer) -> None:
    """Add status, groups, cancel and show to the ``weave`` app."""
    app.command("status")(status)
    app.command("groups")(groups)
    app.command("cancel")(cancel)
    app.command("show")(show)
