"""The policy model of the reference job: a tiny random Llama, and loading tensors into it.

Shared by :mod:`~weave_slurm.workloads.grpo_toy` and its backends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from weave_slurm.errors import StateError
from weave_slurm.workloads.grpo_options import BOS_ID, SEP_ID, GrpoToyOptions

if TYPE_CHECKING:
    from torch import Tensor, nn


def build_policy(opts: GrpoToyOptions, seed: int) -> nn.Module:
    """A randomly initialised Llama, bit-identical for the same ``(opts, seed)``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=opts.vocab_size, hidden_size=opts.hidden_size,
        intermediate_size=opts.intermediate_size, num_hidden_layers=opts.num_layers,
        num_attention_heads=opts.num_heads, num_key_value_heads=opts.num_heads,
        max_position_embeddings=(opts.prompt_len + opts.response_len_max + 8
                                 if opts.long_tail else 2 * opts.prompt_len + 8),
        bos_token_id=BOS_ID,
        eos_token_id=SEP_ID, pad_token_id=0, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # no dropout anywhere: train mode would change nothing, but keep it explicit
    model.eval()  # type: ignore[no-untyped-call]
    return model


def sub_tensors(tensors: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_module(module: nn.Module, tensors: Mapping[str, Tensor], what: str, *,
                assign: bool = False) -> None:
    """Load ``tensors`` (exactly the module's keys) into ``module``; ``assign``: bind the
    parameters to them, after checking dtypes and shapes."""
    import torch

    expected = set(module.state_dict())
    missing = sorted(expected - set(tensors))
    extra = sorted(set(tensors) - expected)
    if missing or extra:
        raise StateError(f"grpo-toy {what}: keys do not match the model "
                         f"(missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        if assign:   # same dtypes and shapes, or the model would silently change
            for name, t in module.state_dict().items():
                got = tensors[name]
                if got.dtype != t.dtype or got.shape != t.shape:
                    raise StateError(f"grpo-toy {what}: {name} is {got.dtype}"
                                     f"{list(got.shape)}, the model has {t.dtype}"
                                     f"{list(t.shape)}")
        module.load_state_dict(dict(tensors), strict=True, assign=assign)
