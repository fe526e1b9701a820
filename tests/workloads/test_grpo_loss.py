"""The GRPO objective: one implementation, token-mean over every token or over a mask."""

from __future__ import annotations

from typing import Any

import pytest

from weave_slurm.workloads.grpo import GrpoHyper, grpo_loss

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _inputs(n: int = 6, r: int = 5) -> tuple[Any, Any, Any, Any]:
    """logp, old_logp, ref_logp ``[n, r]`` and advantages ``[n]``."""
    g = torch.Generator().manual_seed(7)
    logp = torch.randn(n, r, generator=g) * 0.1 - 1.0
    old = logp + torch.randn(n, r, generator=g) * 0.3
    ref = logp + torch.randn(n, r, generator=g) * 0.2
    return logp, old, ref, torch.randn(n, generator=g)


def test_a_mask_of_ones_gives_the_plain_token_mean_bit_for_bit() -> None:
    logp, old, ref, adv = _inputs()
    plain, plain_m = grpo_loss(logp, old, ref, adv, GrpoHyper())
    masked, masked_m = grpo_loss(logp, old, ref, adv, GrpoHyper(), torch.ones_like(logp))
    assert torch.equal(plain, masked) and plain_m == masked_m


def test_masked_tokens_do_not_count() -> None:
    logp, old, ref, adv = _inputs()
    mask = torch.ones_like(logp)
    mask[:, 3:] = 0.0                                       # padding past each response
    noisy = [t.clone() for t in (logp, old, ref)]
    for t in noisy:
        t[:, 3:] = torch.randn(t.shape[0], t.shape[1] - 3)
    loss, metrics = grpo_loss(logp, old, ref, adv, GrpoHyper(), mask)
    again, again_m = grpo_loss(*noisy, adv, GrpoHyper(), mask)
    assert torch.equal(loss, again) and metrics == again_m
    cut, cut_m = grpo_loss(logp[:, :3], old[:, :3], ref[:, :3], adv, GrpoHyper())
    assert torch.allclose(loss, cut) and cut_m == pytest.approx(metrics)
