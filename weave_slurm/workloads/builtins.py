"""The built-in jobs (``entry = "builtin:<name>"``) and what each accepts, checked
without torch.

A built-in is refused at submission, in one line, for whatever its workers would
refuse at run time (after the allocation was paid for): an algorithm it does not
implement, an ``[options]`` table it does not take, a layout it cannot run (a
``batch`` sampling stream split over engines, a training gang it cannot shard, more
than one rank where it runs one), or an extra that is not installed where its workers
run. :func:`check_builtin` is that check; the workers run the same option parsers.
Nothing here imports torch: weaved and ``weave-sbatch --test-only`` call it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from weave_slurm.config.job import Algorithm, JobSpec, options_dict
from weave_slurm.errors import ConfigError
from weave_slurm.model.layout import MemberLayout
from weave_slurm.workloads.grpo_options import GrpoToyOptions, Sampling

#: A built-in's check of its ``[options]`` against the member's layout.
OptionsCheck = Callable[[dict[str, Any], MemberLayout], None]


@dataclass(frozen=True)
class Builtin:
    """One built-in job: its factory, what it implements, what it needs installed."""

    name: str
    target: str                          # "module:factory", imported by the workers
    algorithms: frozenset[Algorithm]     # the spec's `algorithm` values it implements
    modules: tuple[str, ...]             # what its workers import (beyond weave)
    extra: str                           # the pip extra that installs them
    check: OptionsCheck

    @property
    def entry(self) -> str:
        return f"builtin:{self.name}"


def _grpo_toy(options: dict[str, Any], layout: MemberLayout) -> None:
    """What :class:`~weave_slurm.workloads.grpo_toy.GrpoToyJob` and its training gang
    (:mod:`~weave_slurm.workloads.grpo_fsdp`) refuse at set-up."""
    opts = GrpoToyOptions.from_mapping(options)
    engines, ranks = layout.rollout.engines, layout.train.ranks
    if engines > 1 and not opts.per_prompt:
        raise ConfigError(f"options.sampling = {opts.sampling!r}: a rollout over {engines} "
                          "engines needs 'per_prompt' (a 'batch' stream depends on how the "
                          "prompts are split over engines); valid here: per_prompt")
    rows = opts.prompts_per_step * opts.group_size // opts.minibatches
    if rows < ranks:
        raise ConfigError(f"options.minibatches = {opts.minibatches}: a minibatch of {rows} "
                          f"rows leaves ranks of a training gang of {ranks} without a row; "
                          f"valid: prompts_per_step x group_size / minibatches >= {ranks}")


def _deepspeed(options: dict[str, Any], layout: MemberLayout) -> None:
    """DeepSpeed's own keys (``[options.engine] zero_stage``, taken out by its parser,
    as its workers do), then the reference job's."""
    from weave_slurm.workloads.deepspeed_backend import _zero_stage

    _zero_stage(options)
    _grpo_toy(options, layout)


def _vllm(options: dict[str, Any], layout: MemberLayout) -> None:
    """vLLM's engine table (taken out by its parser, against the layout's GPUs per
    engine), then the reference job's."""
    from weave_slurm.workloads.vllm_backend import engine_args

    engine_args(options, layout.rollout.engine_gpus)
    _grpo_toy(options, layout)


def _one_rank(what: str, then: OptionsCheck) -> OptionsCheck:
    """A job that runs each role as one process: a layout of 1 rank and 1 engine."""
    def check(options: dict[str, Any], layout: MemberLayout) -> None:
        if layout.train.ranks != 1 or layout.rollout.engines != 1:
            raise ConfigError(f"{what} runs each role as one process; this layout is "
                              f"{layout.words()}: set gpus.train = 1 and gpus.rollout = 1 "
                              "(one engine)")
        then(options, layout)
    return check


def _trl_options(options: dict[str, Any], layout: MemberLayout) -> None:
    from weave_slurm.workloads.trl_tiny import options as parse

    parse(options)


_GRPO = frozenset({Algorithm.GRPO})
_TORCH = ("torch", "transformers")

BUILTINS: dict[str, Builtin] = {b.name: b for b in (
    Builtin("grpo-toy", "weave_slurm.workloads.grpo_toy:GrpoToyJob", _GRPO, _TORCH, "rl",
            _grpo_toy),
    Builtin("grpo-toy-deepspeed", "weave_slurm.workloads.deepspeed_backend:DeepSpeedGrpoJob",
            _GRPO, (*_TORCH, "deepspeed"), "deepspeed",
            _deepspeed),
    Builtin("grpo-toy-vllm", "weave_slurm.workloads.vllm_backend:VllmGrpoJob", _GRPO,
            (*_TORCH, "vllm"), "vllm", _vllm),
    Builtin("trl-grpo-tiny", "weave_slurm.workloads.trl_tiny:make", _GRPO,
            (*_TORCH, "trl", "datasets"), "trl",
            _one_rank("builtin:trl-grpo-tiny (TRL's GRPOTrainer)", _trl_options)),
)}


def builtin(entry: str, source: str = "") -> Builtin:
    """The built-in ``entry`` (``builtin:<name>``) names; ConfigError listing them
    (``source``: the spec, named first)."""
    name = entry[len("builtin:"):]
    if name not in BUILTINS:
        where = f"{source}: " if source else ""
        raise ConfigError(f"{where}key 'entry' = {entry!r}: no such built-in job; valid: "
                          f"{', '.join(b.entry for b in BUILTINS.values())}, or "
                          "'package.module:factory' for your own")
    return BUILTINS[name]


def check_builtin(job: JobSpec, layout: MemberLayout, installed: bool = True) -> None:
    """Refuse (ConfigError naming the spec and key) what the built-in ``job.entry``
    would refuse at run time; ``installed``: its modules are looked up in this
    interpreter (the workers' one)."""
    assert job.entry is not None and job.entry.startswith("builtin:")
    b = builtin(job.entry, job.source)
    where = job.source
    if job.algorithm not in b.algorithms:
        raise ConfigError(f"{where}: key 'algorithm' = {job.algorithm.value!r}: {b.entry} "
                          f"implements {', '.join(sorted(a.value for a in b.algorithms))}; "
                          "running it would train another algorithm than the spec names")
    try:
        b.check(options_dict(job.options), layout)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {b.entry}: {exc}") from None
    missing = [m for m in b.modules if installed and importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"{where}: {b.entry} needs {', '.join(missing)}, not installed "
                          f"in the workers' Python: pip install 'weave-slurm[{b.extra}]' "
                          "(docs/deploy.md)")


#: Built-ins whose batch depends on their engine count whatever their options, and why.
_WIDTH_BOUND = {
    "grpo-toy-vllm": "vLLM batches the requests its own way on each engine: its batch at "
                     "another engine count is not checked bit-identical",
    "trl-grpo-tiny": "the TRL job runs one engine (its GRPOTrainer refuses world_size > 1)",
}


def not_poolable(entry: str, options: Any, cooperative: bool = False) -> str | None:
    """Why a job's rollout result would depend on how many engines it runs as, in words
    (None: it does not: a pooled group may spread it over any width, docs/runtime.md
    "Pooled members"). Only what is shown to be width-free is poolable: the reference
    job's and the DeepSpeed job's rollouts (the same generate) with ``options.sampling
    = "per_prompt"`` (``bench/rollout_width.py`` checks the merged batch bit-identical
    at 1, 2, 4 and 8 engines); weave cannot look into a job's own code, nor into a
    cooperative job's processes. ``cooperative``: the spec has a ``[launch]`` table."""
    if cooperative:
        return "a cooperative [launch] job: its own process runs its rollout as one engine"
    if not is_builtin(entry):
        return (f"entry {entry!r} is the job's own code: weave cannot tell whether its "
                "batch depends on the engine count")
    name = entry[len("builtin:"):]
    if name not in BUILTINS:
        return f"entry {entry!r} is no built-in job"
    if name in _WIDTH_BOUND:
        return _WIDTH_BOUND[name]
    sampling = options_dict(options).get("sampling", GrpoToyOptions.sampling)
    if sampling != Sampling.PER_PROMPT.value:
        return (f"options.sampling = {sampling!r}: its stream depends on how the prompts "
                "are split over engines (valid for pooling: 'per_prompt')")
    return None


def pooling_words(entry: str, options: Any, cooperative: bool = False) -> str:
    """``poolable (any width)`` or ``not poolable: <why>`` (:func:`not_poolable`)."""
    why = not_poolable(entry, options, cooperative)
    return "poolable (any width)" if why is None else f"not poolable: {why}"


def is_builtin(entry: str) -> bool:
    return entry.startswith("builtin:")


def targets() -> Mapping[str, str]:
    """name -> ``module:factory`` of every built-in."""
    return {name: b.target for name, b in BUILTINS.items()}
