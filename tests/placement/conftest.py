from __future__ import annotations

from hypothesis import strategies as st

from weave_slurm.model.cost import CostRates
from weave_slurm.model.profile import JobProfile, simple_profile
from weave_slurm.placement.capacity import Capacity

REF_RATES = CostRates(rollout_node_hour=1 / 3, train_node_hour=1.0)


def capacity(max_group_size: int = 3, mem: float = 1e9, pool: int = 10**6) -> Capacity:
    return Capacity(max_group_size, 8, mem, mem, pool, pool, REF_RATES)


@st.composite
def job_profiles(draw: st.DrawFn, job_id: str) -> JobProfile:
    return simple_profile(
        job_id,
        rollout_s=draw(st.floats(25, 600)),
        train_s=draw(st.floats(25, 600)),
        slo=draw(st.floats(1.0, 2.0)),
        rollout_nodes=draw(st.sampled_from([1, 1, 1, 2])),
        sync_s=draw(st.floats(0, 20)),
        rollout_state_gib=draw(st.floats(50, 600)),
        train_state_gib=draw(st.floats(50, 600)),
    )


@st.composite
def job_lists(draw: st.DrawFn, min_size: int = 1, max_size: int = 12) -> list[JobProfile]:
    n = draw(st.integers(min_size, max_size))
    return [draw(job_profiles(f"j{i}")) for i in range(n)]
