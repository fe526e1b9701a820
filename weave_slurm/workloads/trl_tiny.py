"""The shipped TRL example (``builtin:trl-grpo-tiny``): TRL's ``GRPOTrainer`` on a tiny
random-weight Llama, as a hosted job through :class:`~weave_slurm.workloads.trl_grpo.TrlGrpoJob`.

No network and no model hub: the model is built from a ``LlamaConfig`` with random
weights drawn from the job's seed (2 layers, 64 wide), the tokenizer is a
``tokenizers`` WordLevel model over the task's words wrapped in
``PreTrainedTokenizerFast``, and the dataset is a ``datasets.Dataset`` of prompts
drawn from the seed. The task: ``copy 3 1 :`` asks for ``3 1``; the reward is the
fraction of positions right. With the defaults and seed 0 the batch-mean reward goes
from ~0.13 (a uniform guess over the 14 words scores ~0.07) to ~0.5 in 300 steps, ~8 s
on one CPU thread. Run with ``HF_HUB_OFFLINE=1``. It is also the template of a user's
own TRL job (docs/job_api.md, "TRL's GRPOTrainer").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from weave_slurm.errors import ConfigError
from weave_slurm.workloads.api import JobContext
from weave_slurm.workloads.trl_grpo import TrlGrpoJob

#: Options of the example and their defaults (every one may be set in ``[options]``).
DEFAULTS: dict[str, int | float | str] = {
    "prompts": 64,              # dataset size
    "prompt_len": 2,            # digits per prompt
    "prompts_per_step": 4,      # prompts per rollout
    "num_generations": 8,       # completions per prompt (GRPO's group)
    "max_completion_length": 3,
    "hidden_size": 64,
    "num_layers": 2,
    "learning_rate": 3e-3,
    "max_steps": 300,           # the LR schedule's length (linear decay)
    "num_threads": 1,
    "output_dir": "trl-output",  # TRL's output directory, under the worker's directory
}
WORDS = ("<pad>", "<eos>", "<unk>", "copy", ":", *(str(d) for d in range(10)))


def options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The example's options: the defaults updated from ``raw``; unknown keys refused."""
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"options: unknown key {unknown[0]!r} (valid: {', '.join(DEFAULTS)})")
    out: dict[str, Any] = dict(DEFAULTS)
    for key, value in raw.items():
        want = type(DEFAULTS[key])
        ok = (isinstance(value, want) or (want is float and isinstance(value, int))) \
            and not isinstance(value, bool)
        if not ok or (want is int and value < 1):
            raise ConfigError(f"options: key {key!r} = {value!r}: must be "
                              f"{'an integer >= 1' if want is int else want.__name__}")
        out[key] = value
    return out


def tokenizer() -> Any:
    """A WordLevel tokenizer over :data:`WORDS`, built locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def copy_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    """Fraction of the prompt's digits the completion repeats in place."""
    out: list[float | None] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        want, got = prompt.split()[1:-1], completion.split()
        out.append(sum(a == b for a, b in zip(want, got, strict=False)) / len(want))
    return out


def build(ctx: JobContext) -> Any:
    """The ``GRPOTrainer`` of this job instance (same initial weights on every call)."""
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    opt = options(ctx.options)
    torch.set_num_threads(opt["num_threads"])
    gen = torch.Generator().manual_seed(ctx.seed)
    digits = torch.randint(0, 10, (opt["prompts"], opt["prompt_len"]), generator=gen)
    prompts = ["copy " + " ".join(map(str, row.tolist())) + " :" for row in digits]
    torch.manual_seed(ctx.seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(WORDS), hidden_size=opt["hidden_size"],
        intermediate_size=2 * opt["hidden_size"], num_hidden_layers=opt["num_layers"],
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=None))
    args = GRPOConfig(
        output_dir=os.path.join(opt["output_dir"], f"{ctx.job_id}-{ctx.role.value}"),
        use_cpu=ctx.device == "cpu", bf16=False,   # TRL's default is bf16 autocast
        seed=ctx.seed, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True,   # TRL prints its log line each step
        per_device_train_batch_size=opt["prompts_per_step"] * opt["num_generations"],
        num_generations=opt["num_generations"],
        max_completion_length=opt["max_completion_length"],
        learning_rate=opt["learning_rate"], max_steps=opt["max_steps"])
    return GRPOTrainer(model=model, reward_funcs=copy_reward, args=args,
                       train_dataset=Dataset.from_dict({"prompt": prompts}),
                       processing_class=tokenizer())


def make() -> TrlGrpoJob:
    """The entry point: ``builtin:trl-grpo-tiny`` (or ``weave_slurm.workloads.trl_tiny:make``)."""
    return TrlGrpoJob(build)
