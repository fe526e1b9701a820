"""The numbers ``weave plan`` shows: groups, slowdowns, bubbles, GPUs and cost (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from weave_slurm.config.site import SiteConfig
from weave_slurm.model.profile import JobProfile
from weave_slurm.placement.admission import place_batch
from weave_slurm.placement.baselines import make_policy
from weave_slurm.placement.capacity import Capacity
from weave_slurm.placement.cluster_state import ClusterState
from weave_slurm.placement.decision import Placement, Refusal

BASELINES = ("isolated", "colocated")


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd)


def _nodes(x: float) -> float:
    """Nodes held: whole (an int) unless pooled GPUs make a share of one."""
    return x if isinstance(x, int) else _r(x, 3)


def plan_summary(site: SiteConfig, jobs: Sequence[JobProfile], policy: str = "weave",
                 max_group_size: int | None = None, pooled: bool = False) -> dict[str, Any]:
    """Place ``jobs`` as one batch with ``policy`` and compare with the baselines
    (``pooled``: weave's groups pool their rollout GPUs; the baselines keep whole nodes)."""
    cap = Capacity.from_site(site, max_group_size)
    main = _policy_summary(site, replace(cap, rollout_pooled=pooled and policy == "weave"),
                           jobs, policy)
    baselines = {name: _policy_summary(site, cap, jobs, name)
                 for name in BASELINES if name != policy}
    main["baselines"] = {
        name: {k: b[k] for k in ("cost_per_hour", "cost_per_job_hour", "pools", "groups_count")}
        for name, b in baselines.items()}
    main["cost_ratio"] = {
        f"vs_{name}": _r(b["cost_per_hour"] / main["cost_per_hour"])
        if main["cost_per_hour"] else None for name, b in baselines.items()}
    main["cost_per_job_hour_ratio"] = {
        f"vs_{name}": _r(b["cost_per_job_hour"] / main["cost_per_job_hour"])
        if main["cost_per_job_hour"] else None for name, b in baselines.items()}
    return main


def _policy_summary(site: SiteConfig, cap: Capacity, jobs: Sequence[JobProfile],
                    policy: str) -> dict[str, Any]:
    result = place_batch(make_policy(policy), ClusterState(cap), jobs)
    state = result.state
    jobs_out: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    progress = 0.0
    for job, decision in zip(jobs, result.decisions, strict=True):
        if isinstance(decision, Refusal):
            refused.append({"job": job.job_id, "reasons": list(decision.reasons),
                            "retry": decision.retry})
            continue
        assert isinstance(decision, Placement)
        group = state.by_id[state.job_group[job.job_id]]
        sched = group.schedule
        at = group.job_ids.index(job.job_id)
        slowdown = sched.slowdowns[at]
        if sched.expected_period_s:
            progress += group.members[at].turns * job.solo_mean_s / sched.expected_period_s
        jobs_out.append({
            "job": job.job_id, "name": job.name, "user": job.user, "group": group.group_id,
            "admission": decision.admission.value, "slo": _r(job.slo, 3),
            "turns": group.members[at].turns,
            "slowdown": _r(slowdown), "within_slo": slowdown <= job.slo + 1e-9,
            "solo_s": _r(job.solo_s, 1), "rollout_max_s": _r(job.rollout_max_s, 1),
            "rollout_mean_s": _r(job.rollout_mean_s, 1), "train_s": _r(job.train_max_s, 1),
            "sync_s": _r(job.sync_s, 2), "rollout_nodes": job.rollout_nodes,
            "train_nodes": job.train_nodes, "rollout_state_gib": _r(job.rollout_state_gib, 1),
            "train_state_gib": _r(job.train_state_gib, 1),
            "gpu_gib": {"rollout_peak": _r(job.rollout_gpu_peak_gib, 2),
                        "rollout_resident": _r(job.rollout_gpu_resident_gib, 2),
                        "train_peak": _r(job.train_gpu_peak_gib, 2),
                        "train_resident": _r(job.train_gpu_resident_gib, 2)}})
    groups_out = []
    for g in state.groups:
        s = g.schedule
        groups_out.append({
            "group": g.group_id, "members": list(g.job_ids), "colocated": g.colocated,
            "rollout_nodes": _nodes(g.rollout_held_nodes), "train_nodes": g.train_nodes,
            "pool_gpus": g.pool_gpus,   # a pooled group's rollout GPUs (0: whole nodes)
            "rollout_pins": {m.job.job_id: list(m.rollout_pins) for m in g.members},
            "period_s": _r(s.period_s, 1), "expected_period_s": _r(s.expected_period_s, 1),
            "rollout_bubble": _r(1 - s.rollout_busy) if g.rollout_nodes else None,
            "train_bubble": _r(1 - s.train_busy),
            "rollout_mem_gib": [_r(x, 1) for x in s.rollout_mem_gib],
            "train_mem_gib": [_r(x, 1) for x in s.train_mem_gib],
            # per GPU of each node, in its peak case (switched-out residents + one active)
            "rollout_gpu_mem_gib": [_r(x, 2) for x in s.rollout_gpu_mem_gib],
            "train_gpu_mem_gib": [_r(x, 2) for x in s.train_gpu_mem_gib],
            "cost_per_hour": _r(cap.rate_of(g), 2)})
    r_nodes, t_nodes = state.rollout_nodes_used, state.train_nodes_used
    cost = state.cost_per_hour
    return {
        "site": site.name, "currency": site.currency, "policy": policy,
        "jobs": jobs_out, "groups": groups_out, "refused": refused,
        "groups_count": len(state.groups),
        "pools": {
            "rollout": {"partition": site.rollout.partition, "nodes": _nodes(r_nodes),
                        "gpus": round(r_nodes * site.rollout.gpus_per_node),
                        "bubble": _pool_bubble(state, rollout=True)},
            "train": {"partition": site.train.partition, "nodes": t_nodes,
                      "gpus": t_nodes * site.train.gpus_per_node,
                      "bubble": _pool_bubble(state, rollout=False)}},
        "cost_per_hour": _r(cost, 2),
        # Cost per hour of solo-speed progress: a job slowed 1.5x counts as 2/3 of a job.
        "cost_per_job_hour": _r(cost / progress, 2) if progress else None,
    }


def _pool_bubble(state: ClusterState, rollout: bool) -> float | None:
    busy = total = 0.0
    for g in state.groups:
        nodes = g.rollout_held_nodes if rollout else g.train_nodes
        frac = g.schedule.rollout_busy if rollout else g.schedule.train_busy
        busy += frac * nodes
        total += nodes
    return _r(1 - busy / total) if total else None
