"""The poolability rule (workloads/builtins.py ``not_poolable``): only a job whose batch
is shown not to depend on its engine count may be spread over a pool of any width."""

from __future__ import annotations

import pytest

from weave_slurm.workloads.builtins import not_poolable, pooling_words


@pytest.mark.parametrize("entry", ["builtin:grpo-toy", "builtin:grpo-toy-deepspeed"])
def test_the_reference_rollout_with_per_prompt_sampling_is_poolable(entry: str) -> None:
    assert not_poolable(entry, {"sampling": "per_prompt"}) is None
    assert pooling_words(entry, {"sampling": "per_prompt"}) == "poolable (any width)"
    # the spec's frozen form of [options] (tuples of pairs) reads the same
    assert not_poolable(entry, (("sampling", "per_prompt"), ("num_threads", 1))) is None


@pytest.mark.parametrize(("entry", "options", "cooperative", "why"), [
    ("builtin:grpo-toy", {}, False,
     "options.sampling = 'batch': its stream depends on how the prompts are split over "
     "engines (valid for pooling: 'per_prompt')"),
    ("builtin:grpo-toy", {"sampling": "batch"}, False, "options.sampling = 'batch'"),
    ("builtin:trl-grpo-tiny", {"sampling": "per_prompt"}, False,
     "the TRL job runs one engine (its GRPOTrainer refuses world_size > 1)"),
    ("builtin:grpo-toy-vllm", {"sampling": "per_prompt"}, False, "vLLM batches the requests"),
    ("mypkg.jobs:make", {"sampling": "per_prompt"}, False,
     "entry 'mypkg.jobs:make' is the job's own code: weave cannot tell whether its batch "
     "depends on the engine count"),
    ("builtin:grpo-toy", {"sampling": "per_prompt"}, True,
     "a cooperative [launch] job: its own process runs its rollout as one engine"),
    ("builtin:nope", {}, False, "entry 'builtin:nope' is no built-in job"),
])
def test_a_job_whose_batch_may_depend_on_its_width_is_not_poolable(
        entry: str, options: dict[str, str], cooperative: bool, why: str) -> None:
    got = not_poolable(entry, options, cooperative)
    assert got is not None and got.startswith(why)
    assert pooling_words(entry, options, cooperative) == f"not poolable: {got}"

