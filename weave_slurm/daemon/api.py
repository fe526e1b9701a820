"""What each request does: submit, cancel, status, groups, show (uid from the socket).

Submissions are validated completely (spec, profile, "can it ever fit") before one
transaction inserts the job, so a refused submission leaves nothing behind; paths in
a spec must resolve under the submitter's home or a site root (``check_paths``), and
what the job's workers need (its ``workdir``, ``python``, ``pythonpath``, else the node
interpreter) must be usable by the submitter's uid (``daemon/access.py``, checked as
that uid). A user may cancel and see the details of their own jobs; root and the
configured admin uids may act on all. Listings (status, groups) are visible to
everyone, as squeue is.
"""

from __future__ import annotations

import pwd
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from weave_slurm.config.job import check_paths, parse_job
from weave_slurm.config.oci import check_container, oci_conf_path
from weave_slurm.config.sbatch import refuse_over_site
from weave_slurm.config.site import SiteConfig
from weave_slurm.daemon import job_arrays, limits, membership
from weave_slurm.daemon.access import (
    check_access,
    output_needs,
    unshared_outputs,
    worker_needs,
)
from weave_slurm.daemon.accounting_limits import AccountingFeed
from weave_slurm.daemon.dependencies import unknown_jobs
from weave_slurm.daemon.driver import job_nodes
from weave_slurm.daemon.fault_points import FaultPoint, crossing
from weave_slurm.daemon.job_arrays import array_of
from weave_slurm.daemon.job_output import log_files
from weave_slurm.daemon.job_update import update_job
from weave_slurm.daemon.layout_view import layout_row
from weave_slurm.daemon.protocol import Op, PermissionDenied
from weave_slurm.daemon.records import AllocRow, GroupRow, JobRow, TransitionRow, by_group
from weave_slurm.daemon.runnable import check_runnable
from weave_slurm.daemon.states import JobState
from weave_slurm.daemon.store import Store
from weave_slurm.daemon.usage_view import sacct, slurm_job_ids
from weave_slurm.daemon.waits import requeue_rows, with_requeues
from weave_slurm.errors import (
    AlreadyEnded,
    ConfigError,
    InfeasibleRequest,
    InsufficientResources,
    StateError,
    WeaveError,
)
from weave_slurm.model.profile import profile_job
from weave_slurm.placement import Capacity, Group
from weave_slurm.placement.fit import refuse_if_never_fits

MAX_SPEC_BYTES = 64 * 1024
#: The driver phase of weaved's group runtime (``GroupRuntime.phase``): its jobs run in
#: resident workers of the node daemons weaved starts with its own interpreter.
HOSTED_PHASE = "rl"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _str_set(args: dict[str, Any], key: str) -> frozenset[str]:
    raw = args.get(key) or []
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError(f"request field {key!r} must be a list of strings, got {raw!r}")
    return frozenset(raw)


def _int_list(args: dict[str, Any], key: str) -> list[int]:
    raw = args.get(key, [])
    if not isinstance(raw, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in raw):
        raise ConfigError(f"request field {key!r} must be a list of job ids, got {raw!r}")
    return raw


def weights_view(job: JobRow) -> dict[str, Any]:
    """``weights_sha256``: the SHA-256 of a job's final weights, as stored when it
    completed (it survives a weaved restart); where there is none, why in words."""
    if job.weights_sha256 is not None:
        return {"weights_sha256": job.weights_sha256}
    if job.spec is not None and job.spec.launch is not None:
        why = "none: a cooperative job's weights are its own; weave holds none"
    elif job.state is JobState.COMPLETED:
        why = "none: not read when it completed (weaved's log says why)"
    else:
        why = "none: known once it completes" if not job.state.final \
            else f"none: it ended {job.state.value}"
    return {"weights_sha256": None, "weights_sha256_why": why}


class Api:
    """The request handlers; thread-safe through the store."""

    def __init__(self, store: Store, site: SiteConfig, capacity: Capacity,
                 now: Callable[[], float], *, admin_uids: Sequence[int] = (),
                 wake: Callable[[], None] = lambda: None, phase: str = "idle",
                 live: Callable[[int], dict[str, Any] | None] = lambda job_id: None,
                 path_roots: Sequence[Path] = (),
                 world_error: Callable[[], tuple[float, str] | None] = lambda: None,
                 node_python: str | None = None,
                 waiting: Callable[[int], str | None] = lambda job_id: None,
                 oci_conf: Path | None = None,
                 accounting: AccountingFeed | None = None) -> None:
        self.store, self.site, self.capacity, self.now = store, site, capacity, now
        self.accounting = accounting   # Slurm's limits ([limits] from_slurm)
        self._submitting = threading.Lock()
        self.path_roots = tuple(path_roots)  # shared dirs a spec path may name, besides home
        # the interpreter node daemons fork a job's default workers from; not given:
        # weaved's own when its driver runs hosted jobs (the node daemons it starts run
        # sys.executable), else not known (a site's own node command: not checked)
        self.node_python = node_python if node_python is not None else \
            (sys.executable if phase == HOSTED_PHASE else None)
        self.admins = frozenset({0, *admin_uids})
        self.wake = wake
        self.phase = phase
        self.live = live
        self.waiting = waiting
        self.world_error = world_error
        self.oci_conf = oci_conf_path() if oci_conf is None else oci_conf   # the site's

    def handle(self, op: Op, args: dict[str, Any], uid: int) -> dict[str, Any]:
        if op is Op.SUBMIT:
            return self.submit(uid, args.get("spec"), args.get("source"),
                               test_only=args.get("test_only") is True)
        if op is Op.CANCEL:
            return self.cancel(uid, _int_list(args, "jobs"), args.get("arrays", True) is True)
        if op in (Op.HOLD, Op.RELEASE):
            return self.hold(uid, _int_list(args, "jobs"), op is Op.HOLD)
        if op is Op.UPDATE:
            result = update_job(self.store, self.site, uid, self.admins, args, self.now())
            self.wake()
            return result
        if op is Op.STATUS:
            return self.status(args)
        if op is Op.GROUPS:
            return self.groups()
        if op is Op.SHOW:
            return self.show(uid, args.get("kind"), args.get("id"))
        if op is Op.SACCT:
            return sacct(self.store, self.site, uid, user_name(uid), self.admins, args,
                         self.now())
        return {"daemon": "weaved", "uid": uid, "admin": uid in self.admins}

    # -- submit / cancel ---------------------------------------------------------------

    def submit(self, uid: int, spec: object, source: object,
               test_only: bool = False) -> dict[str, Any]:
        """Store a job (``test_only``: check everything against this site, store nothing,
        and say what it would take, as ``sbatch --test-only`` does)."""
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError("submit: field 'spec' must be the job spec's TOML text")
        if len(spec.encode()) > MAX_SPEC_BYTES:
            raise ConfigError(f"submit: spec is {len(spec.encode())} bytes; the limit is "
                              f"{MAX_SPEC_BYTES}")
        where = source if isinstance(source, str) and source else "<submitted spec>"
        if not where.isprintable() or len(where) > 256:  # errors stay one line
            where = repr(where)[:256]
        job = parse_job(spec, where)
        refuse_over_site(job.slurm, self.site.slurm, where)
        check_container(job, self.oci_conf, where)
        check_paths(job, uid, self.path_roots)
        check_access(job, worker_needs(job, self.node_python) + output_needs(job, uid), uid)
        profile = profile_job(job, self.site)
        never = refuse_if_never_fits(profile, self.capacity)
        if never is not None:
            raise InfeasibleRequest(f"{where}: can never be placed on this site: "
                                    f"{'; '.join(never.reasons)}")
        check_runnable(job, profile.layout, self.site, uid, self.node_python)
        if job.slurm.dependency:
            unknown = unknown_jobs(job.slurm.dependency, lambda j: self.store.job(j) is not None)
            if unknown:
                raise ConfigError(f"{where}: key 'slurm.dependency' = "
                                  f"'{job.slurm.dependency}': no job {unknown[0]} (Slurm: "
                                  "Job dependency problem)")
        warnings = unshared_outputs(job, uid, self.path_roots)
        if test_only:
            return {"job": None, "valid": True, "warnings": warnings,
                    "rollout_nodes": profile.rollout_nodes, "train_nodes": profile.train_nodes,
                    "solo_iteration_s": profile.solo_s, "slo": profile.slo}
        user = user_name(uid)
        account, qos = limits.charged(profile.charge, self.site)
        with self._submitting:   # a limit's count and the new row, one at a time
            refused = limits.submission_refusal(self.store, self.site, user, account,
                                                self.now(), self.accounting, qos)
            if refused is not None:
                raise InsufficientResources(f"{where}: job refused: {refused}")
            ids = self.store.add_jobs(   # an array: one job per element (job_arrays.py)
                uid=uid, user=user, name=job.name, spec_toml=spec, source=where,
                profile=profile, now=self.now(),
                specs=job_arrays.elements(job) if job.slurm.array else lambda first: [job])
        crossing(FaultPoint.SUBMIT_STORED)
        self.wake()
        return {"job": ids[0], "jobs": ids, "warnings": warnings}

    def cancel(self, uid: int, ids: list[int], arrays: bool = True) -> dict[str, Any]:
        """Cancel jobs (``arrays``: an array's job id means all its elements, as scancel)."""
        if not ids:
            raise ConfigError("cancel: give at least one job id")
        results = []
        jobs = self.store.jobs() if arrays else []
        for job_id in dict.fromkeys(e for i in ids for e in (job_arrays.members(i, jobs)
                                                             or [i])):
            try:
                results.append({"job": job_id, "ok": True, "message": self._cancel(uid, job_id)})
            except WeaveError as exc:   # "ended": the job had ended already (typed, not words)
                results.append({"job": job_id, "ok": False, "message": str(exc),
                                "ended": isinstance(exc, AlreadyEnded)})
        self.wake()
        return {"results": results}

    def _cancel(self, uid: int, job_id: int) -> str:
        for _ in range(3):  # the reconcile loop may move the job meanwhile
            job = self._own_job(uid, job_id)
            if job.state.final:
                raise AlreadyEnded(f"Job {job_id} already {job.state.value.lower()}")
            if job.state is JobState.CANCELLING:
                return f"job {job_id} is already being cancelled"
            dst = JobState.CANCELLED if job.state is JobState.PENDING else JobState.CANCELLING
            extra = {"ended_s": self.now()} if dst is JobState.CANCELLED else {}
            try:
                self.store.transition("job", job_id, dst, f"cancelled by uid {uid}", self.now(),
                                      expect=job.state, **extra)
            except StateError:
                continue
            return f"job {job_id} {dst.value.lower()}"
        raise StateError(f"job {job_id} keeps changing state; try again")

    def hold(self, uid: int, ids: list[int], held: bool) -> dict[str, Any]:
        """Hold (or release) pending jobs, as scontrol hold/release: a held job is not
        placed until it is released (daemon/dependencies.py). The jobs of one call change
        as one: a tick sees all of them released or none, so jobs released together are
        placed together."""
        if not ids:
            raise ConfigError(f"{'hold' if held else 'release'}: give at least one job id")
        results = []
        with self.store.held():   # released together, placed together: no tick between
            for job_id in ids:
                try:
                    job = self._own_job(uid, job_id)
                    if job.state is not JobState.PENDING:
                        raise StateError(f"Job {job_id} is {job.state.value}: only a pending "
                                         f"job can be {'held' if held else 'released'}")
                    self.store.update("job", job_id, held=int(held))
                    results.append({"job": job_id, "ok": True,
                                    "message": f"job {job_id} {'held' if held else 'released'}"})
                except WeaveError as exc:
                    results.append({"job": job_id, "ok": False, "message": str(exc)})
        self.wake()
        return {"results": results}

    def _own_job(self, uid: int, job_id: int) -> JobRow:
        """The job, if ``uid`` may act on it (its owner, or an admin)."""
        job = self.store.job(job_id)
        if job is None:
            raise ConfigError(f"Invalid job id specified: {job_id}")
        if uid not in self.admins and uid != job.uid:
            raise PermissionDenied(f"Access/permission denied for job {job_id} (owned by "
                                   f"{job.user})")
        return job

    # -- views -------------------------------------------------------------------------

    def _context(self) -> tuple[dict[int, JobRow], dict[int, GroupRow],
                                dict[int, list[AllocRow]], dict[int, Group]]:
        with self.store.held():   # one view: not a job of one tick in a group of the next
            jobs = {j.job_id: j for j in self.store.jobs()}
            groups = {g.group_id: g for g in self.store.groups(live_only=False)}
            rows = self.store.allocs(live_only=False)
        allocs = by_group(rows)
        models = {gid: m for gid, g in groups.items() if not g.state.final   # as placed
                  for m in [membership.group_model(g, jobs, allocs.get(gid, ()),
                                                   self.capacity)] if m is not None}
        return jobs, groups, allocs, models

    def _job_view(self, job: JobRow, groups: dict[int, GroupRow],
                  allocs: dict[int, list[AllocRow]], models: dict[int, Group],
                  now: float, requeued: Sequence[TransitionRow] = ()) -> dict[str, Any]:
        slowdown, nodes = None, []
        group = groups.get(job.group_id) if job.group_id is not None else None
        if group is not None and not job.state.final:
            model = models.get(group.group_id)
            if model is not None and str(job.job_id) in model.job_ids:
                slowdown = model.schedule.slowdowns[model.job_ids.index(str(job.job_id))]
            # every row, ended ones too: a pin is a slot numbered over all of them
            used = job_nodes(job, group, allocs.get(group.group_id, []))
            nodes = used["rollout"] + used["train"]
        end = job.ended_s if job.ended_s is not None else now
        phase, it = (self.phase if job.state is JobState.RUNNING else "-"), None
        live = self.live(job.job_id)
        slo_ok, behind, reason = None, None, job.reason
        wait = self.waiting(job.job_id) if job.state is JobState.RUNNING else None
        if wait is not None:
            reason = f"waiting: {wait}"
        if live is not None:  # the runtime's measurements replace the plan's numbers
            behind = live.get("current_staleness")
            if job.state is JobState.RUNNING and live.get("event"):
                reason = live["event"]   # its last fault and the recovery, in words
            phase = live.get("phase", phase) if job.state is JobState.RUNNING else "-"
            version = live.get("version")
            it = None if version is None else f"{version}/{live.get('iterations')}"
            if live.get("slowdown") is not None:
                slowdown, slo_ok = live["slowdown"], live.get("slo_ok")
        return {"job": job.job_id, "id": job_arrays.shown_id(job), "user": job.user,
                "uid": job.uid, "name": job.name,
                "group": job.group_id, "state": job.state.value, "phase": phase,
                "iter": it, "slowdown": slowdown, "slo_ok": slo_ok, "slo": job.profile.slo,
                "time_s": end - job.started_s if job.started_s is not None else 0.0,
                "nodes": nodes, "reason": with_requeues(reason, requeued, job.state),
                "requeues": len(requeued), "submitted_s": job.submitted_s,
                "window": job.profile.staleness, "staleness": behind,
                "solo": job.profile.solo,
                "layout": layout_row(job, group, allocs, self.phase == HOSTED_PHASE,
                                     self.site.runtime.gangs, self.site.rollout.gpus_per_node)}

    def status(self, args: dict[str, Any]) -> dict[str, Any]:
        ids = set(_int_list(args, "jobs"))
        users = args.get("users") or []
        if not isinstance(users, list):
            raise ConfigError(f"status: field 'users' must be a list, got {users!r}")
        show_all = bool(args.get("all"))
        # squeue's -t / -n / -p, applied here so that only the rows asked for are built
        states, names, partitions = (_str_set(args, k) for k in ("states", "names",
                                                                 "partitions"))
        jobs, groups, allocs, models = self._context()
        now, requeued = self.now(), self.store.requeued()
        rows = [self._job_view(j, groups, allocs, models, now, requeued.get(j.job_id, ()))
                for j in jobs.values()
                if (show_all or ids or not j.state.final)
                and (not ids or j.job_id in ids or (array_of(j) or (0,))[0] in ids)
                and (not users or j.user in users or str(j.uid) in users)
                and (not states or j.state.value in states)
                and (not names or j.name in names)]
        usage = self.store.usage()
        for row in rows:   # the Slurm jobs it runs (or ran) in, and their partitions
            job = jobs[row["job"]]
            held = allocs.get(job.group_id, []) if job.group_id is not None else []
            row["slurm_job_ids"] = slurm_job_ids(job, held, usage.get(job.job_id))
            row["partitions"] = sorted({a.partition for a in held if not a.state.final})
        if partitions:
            rows = [r for r in rows if partitions & set(r["partitions"])]
        return {"jobs": rows, "now": now, "warnings": self._warnings(now)}

    def _warnings(self, now: float) -> list[str]:
        """What makes this view stale, in words (for ``weave status`` to print)."""
        failing = self.world_error()
        if failing is None:
            return []
        since, why = failing
        return [f"weaved cannot read Slurm's state for {now - since:.0f} s ({why}); job "
                "states may be stale, weaved keeps trying every tick"]

    def _group_view(self, g: GroupRow, allocs: list[AllocRow], model: Group | None,
                    jobs: dict[int, JobRow]) -> dict[str, Any]:
        sched = model.schedule if model is not None else None
        # a job a re-plan moves has a place in both plans until it has moved: it runs in
        # the group it is moving from (a member there, moving out), not yet in its new one
        coming = [j for j in (*g.plan.job_ids, *g.plan.next_ids) if j in jobs
                  and jobs[j].group_id == g.group_id
                  and jobs[j].moving_from not in (None, g.group_id)]
        going = [j for j in g.plan.job_ids if j in jobs and jobs[j].moving_from == g.group_id
                 and jobs[j].group_id != g.group_id]
        return {"group": g.group_id, "label": g.label, "state": g.state.value,
                "members": [j for j in g.plan.job_ids if j not in coming],
                "moving_in": coming, "moving_out": going,
                "rollout_nodes": g.plan.rollout_nodes,
                # a pooled group's GPUs as placement reads them back, else None
                "pool_gpus": model.pool_gpus if model is not None and model.pooled else None,
                "train_nodes": g.plan.train_nodes,
                "period_s": sched.period_s if sched else None,
                "rollout_bubble": 1.0 - sched.rollout_busy if sched else None,
                "train_bubble": 1.0 - sched.train_busy if sched else None,
                "allocations": [{"id": a.alloc_id, "role": a.role, "pool": a.pool,
                                 "partition": a.partition, "state": a.state.value,
                                 "nodes": list(a.held_nodes),
                                 "node_count": a.held_count,
                                 "given_back": list(a.gone)}
                                for a in allocs],
                "created_s": g.created_s}

    def groups(self) -> dict[str, Any]:
        jobs, groups, allocs, models = self._context()
        return {"groups": [self._group_view(g, [a for a in allocs.get(gid, [])
                                                if not a.state.final], models.get(gid), jobs)
                           for gid, g in groups.items() if not g.state.final],
                "partitions": {"rollout": self.site.rollout.partition,
                               "train": self.site.train.partition}}

    def show(self, uid: int, kind: object, ident: object) -> dict[str, Any]:
        if kind not in ("job", "group"):
            raise ConfigError(f"show: kind {kind!r} is unknown; valid: job, group")
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise ConfigError(f"show: id must be an integer, got {ident!r}")
        jobs, groups, allocs, models = self._context()
        if kind == "group":
            g = groups.get(ident)
            if g is None:
                raise ConfigError(f"Invalid group id specified: {ident}")
            view = self._group_view(g, allocs.get(ident, []), models.get(ident), jobs)
            view["transitions"] = [asdict(t) for t in self.store.transitions("group", ident)]
            return view
        job = jobs.get(ident)
        if job is None:
            raise ConfigError(f"Invalid job id specified: {ident}")
        if uid not in self.admins and uid != job.uid:
            raise PermissionDenied(f"Access/permission denied for job {ident} (owned by "
                                   f"{job.user})")
        transitions = self.store.transitions("job", ident)
        requeued = requeue_rows(transitions)
        view = self._job_view(job, groups, allocs, models, self.now(), requeued)
        view["slurm_job_ids"] = slurm_job_ids(job, allocs.get(job.group_id or -1, []),
                                              self.store.usage().get(ident))
        live = self.live(ident)
        if live is not None:
            view["runtime"] = {k: live.get(k) for k in (
                "member_state", "version", "iterations", "node", "rewards", "recoveries",
                "error", "event", "drift", "measured", "weights_sha256")}
        view.update(weights_view(job))
        view["stdout"], view["stderr"] = log_files(job)   # scontrol's StdOut, StdErr
        view.update({"spec": job.spec_toml, "source": job.source,
                     "profile": asdict(job.profile),
                     "planning_profile": (asdict(job.measured) if job.measured is not None
                                          else None),
                     "steps": [{"name": s.name, "state": s.state.value, "reason": s.reason}
                               for s in self.store.steps(job_id=ident, live_only=False)],
                     "requeue_history": [{"ts": t.ts, "reason": t.reason} for t in requeued],
                     "transitions": [asdict(t) for t in transitions]})
        return view
