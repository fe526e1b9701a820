"""GRPO math: group-normalised advantages, token log-probabilities, the clipped objective.

Pure functions over tensors, shared by the reference job, its DeepSpeed variant and
its FSDP2 training gang.
The policy acts over a restricted set of token ids (constrained decoding): its
log-probabilities are a softmax over the logits of ``action_ids`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class CausalLM(Protocol):
    """What we need of a causal LM: ``model(input_ids=..., use_cache=False).logits``."""

    def __call__(self, *, input_ids: torch.Tensor, use_cache: bool) -> object: ...


@dataclass(frozen=True)
class GrpoHyper:
    """Hyper-parameters of the GRPO objective."""

    clip_eps: float = 0.2
    kl_coef: float = 0.02
    adv_eps: float = 1e-6


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: each reward normalised by its group's mean and std.

    ``rewards`` is ``[P * G]`` with the G responses of a prompt contiguous.
    """
    groups = rewards.reshape(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, unbiased=False, keepdim=True)
    return ((groups - mean) / (std + eps)).reshape(-1)


def action_logits(model: CausalLM, tokens: torch.Tensor, response_len: int,
                  action_ids: torch.Tensor) -> torch.Tensor:
    """Logits over the action set for each response position, ``[N, R, A]``."""
    out = model(input_ids=tokens, use_cache=False)
    logits: torch.Tensor = out.logits  # type: ignore[attr-defined]
    # position t predicts token t+1: the R response tokens are predicted by the R
    # positions before them.
    width = tokens.shape[1]
    pred = logits[:, width - response_len - 1: width - 1, :]
    return pred.index_select(-1, action_ids)


def action_logprobs(model: CausalLM, tokens: torch.Tensor, actions: torch.Tensor,
                    action_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each taken action (index into ``action_ids``), ``[N, R]``."""
    import torch

    logits = action_logits(model, tokens, actions.shape[1], action_ids)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor,
              advantages: torch.Tensor, hyper: GrpoHyper, mask: torch.Tensor | None = None,
              count: float | torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-ratio policy loss plus a KL penalty (k3 estimator) to the reference.

    All log-prob tensors are ``[N, R]``; ``advantages`` is ``[N]``. Token-mean: over
    every token, or with ``mask`` (``[N, R]``, 1 = a response token) over the tokens
    where it is 1 only, so padding past a response's end is ignored. ``count``: divide
    the token sum by this instead (a data-parallel rank passes the token count of the
    whole minibatch, so that the ranks' losses and metrics add up to the mean).
    """
    import torch

    adv = advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - hyper.clip_eps, 1.0 + hyper.clip_eps)
    policy = -_token_mean(torch.minimum(ratio * adv, clipped * adv), mask, count)
    log_ref_ratio = ref_logp - logp
    kl = _token_mean(torch.exp(log_ref_ratio) - log_ref_ratio - 1.0, mask, count)
    loss = policy + hyper.kl_coef * kl
    clip_frac = _token_mean(((ratio - 1.0).abs() > hyper.clip_eps).float(), mask, count)
    metrics = {"policy_loss": float(policy.detach()), "kl": float(kl.detach()),
               "clip_frac": float(clip_frac)}
    return loss, metrics


def _token_mean(values: torch.Tensor, mask: torch.Tensor | None,
                count: float | torch.Tensor | None = None) -> torch.Tensor:
    """The mean of ``values``; with ``mask``, over the tokens where it is 1 (at least one);
    with ``count``, the (masked) sum divided by ``count``."""
    if count is not None:
        return (values if mask is None else values * mask).sum() / count
    if mask is None:
        return values.mean()
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
