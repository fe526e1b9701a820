"""Analytic performance and state-size model (pure; formulas in docs/model.md).

Used only where a job spec carries no measured profile. Rollout is decode-bound
(weights and KV cache streamed from HBM once per decode step), training is
compute-bound (~6 x params x tokens FLOPs at a stated MFU), sync is bytes over each
network tier's bandwidth. The admission bound assumes every response reaches
``max_response_tokens``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from weave_slurm.config.job import Algorithm, JobSpec
from weave_slurm.config.site import GpuSpec, ModelConfig, NetworkConfig

GIB = float(1 << 30)
BF16_BYTES = 2
#: Fallback KV-cache bytes per token per billion parameters, from Qwen2.5 configs
#: (7B: 57 KiB/token with 28 layers x 4 KV heads x 128; 32B: 256 KiB with 64 x 8 x 128).
KV_BYTES_PER_TOKEN_PER_B = 8192.0
#: Bytes of training state per parameter: bf16 weights + bf16 grads + fp32 Adam
#: (master, m, v) = 2 + 2 + 12 (ZeRO paper, Rajbhandari et al. 2020).
TRAIN_BYTES_PER_PARAM = 16
#: Fraction of HBM the weights of one rollout replica may take; the rest is KV cache.
WEIGHT_HBM_FRACTION = 0.5
#: Fraction of HBM usable by the rollout engine (vLLM's gpu_memory_utilization default).
HBM_UTILIZATION = 0.9

# What a switched-out member still holds on each of its GPUs (GiB), where the spec's
# [profile] gives no measured figure (docs/model.md "Device memory"). Its process lives
# on, so its CUDA context stays (torch.cuda.memory_allocated's documentation: less than
# nvidia-smi shows, because of the context and the caching allocator), so do its NCCL
# communicators' buffers (NCCL_BUFFSIZE, 4 MiB by default, for each pair of GPUs a
# channel connects: e.g. 32 ring channels x 2 peers x 4 MiB = 256 MiB for one
# protocol), and the caching allocator keeps the segments a live block still pins
# after empty_cache. These are round allowances, not measurements: give measured
# figures (torch.cuda.mem_get_info after a switch-out) in [profile].
#: The CUDA context and the CUDA libraries' workspaces.
CUDA_CONTEXT_GIB = 0.5
#: NCCL buffers of the member's communicators.
NCCL_BUFFERS_GIB = 0.25
#: What the caching allocator does not give back (segments holding a live block).
ALLOCATOR_CACHE_GIB = 0.25
#: The three together: a switched-out member's device memory per GPU.
DEVICE_RESIDENT_GIB = CUDA_CONTEXT_GIB + NCCL_BUFFERS_GIB + ALLOCATOR_CACHE_GIB
#: Fallback activation bytes per token per billion parameters (checkpointed layer
#: inputs, ``2 x layers x hidden``), from Qwen2.5 configs: 7B keeps 2 x 28 x 3584 =
#: 196 KiB/token (26 KiB per billion), 32B 2 x 64 x 5120 = 640 KiB (20 KiB per billion).
ACT_BYTES_PER_TOKEN_PER_B = 24576.0


@dataclass(frozen=True, slots=True)
class RolloutEstimate:
    max_s: float
    tensor_parallel: int
    waves: int
    state_gib_per_gpu: float


def weights_gib(params_b: float) -> float:
    return params_b * 1e9 * BF16_BYTES / GIB


def kv_bytes_per_token(spec: JobSpec) -> float:
    m = spec.model
    if m.layers and m.kv_heads and m.head_dim:
        return 2.0 * m.layers * m.kv_heads * m.head_dim * BF16_BYTES
    return KV_BYTES_PER_TOKEN_PER_B * m.params_b


def mean_response_tokens(spec: JobSpec) -> float:
    r = spec.rollout
    return float(r.mean_response_tokens) if r.mean_response_tokens else 0.5 * r.max_response_tokens


def estimate_rollout(spec: JobSpec, gpu: GpuSpec, gpus: int, mc: ModelConfig,
                     tp: int | None = None) -> RolloutEstimate:
    """Conservative rollout time: every sequence decodes ``max_response_tokens`` tokens.

    ``tp``: GPUs per replica (the job's layout, :mod:`weave_slurm.model.layout`); None:
    the smallest power of two whose HBM holds the weights in at most half of it (the
    co-located baseline's rollout on the training GPUs, which has no layout of its own).
    """
    w_bytes = weights_gib(spec.model.params_b) * GIB
    hbm = gpu.hbm_gib * GIB
    if tp is None:
        tp = replica_gpus(spec.model.params_b, gpu, most=gpus)
    tp = min(tp, gpus)
    replicas = max(1, gpus // tp)
    seqs = math.ceil(spec.rollout.sequences / replicas)
    kv_tok = kv_bytes_per_token(spec)
    full_ctx = spec.rollout.prompt_tokens + spec.rollout.max_response_tokens
    kv_free = max(hbm * HBM_UTILIZATION * tp - w_bytes, 0.05 * hbm * tp)
    waves = max(1, math.ceil(seqs * full_ctx * kv_tok / kv_free))
    per_wave = math.ceil(seqs / waves)
    avg_ctx = spec.rollout.prompt_tokens + spec.rollout.max_response_tokens / 2
    bw = tp * gpu.hbm_tbps * 1e12 * mc.decode_bw_efficiency
    step_mem = (w_bytes + kv_tok * per_wave * avg_ctx) / bw
    step_flops = 2 * spec.model.params_b * 1e9 * per_wave / (tp * gpu.bf16_tflops * 1e12 * 0.5)
    decode = waves * spec.rollout.max_response_tokens * max(step_mem, step_flops)
    prefill = (2 * spec.model.params_b * 1e9 * spec.rollout.prompt_tokens * spec.rollout.sequences
               / (gpus * gpu.bf16_tflops * 1e12 * mc.train_mfu))
    kv_per_gpu = min(seqs * full_ctx * kv_tok / tp, kv_free / tp)
    state_per_gpu = (w_bytes / tp + kv_per_gpu) / GIB
    return RolloutEstimate(decode + prefill, tp, waves, state_per_gpu)


def replica_gpus(params_b: float, gpu: GpuSpec, most: int = 64) -> int:
    """GPUs of one rollout engine replica when nothing says: the smallest power of two
    whose HBM holds the weights in at most :data:`WEIGHT_HBM_FRACTION` of it (the rule
    :func:`estimate_rollout` and the layout use)."""
    tp, w = 1, weights_gib(params_b)
    while w / tp > WEIGHT_HBM_FRACTION * gpu.hbm_gib and tp < most:
        tp *= 2
    return tp


def decode_floor_s(params_b: float, max_tokens: int, replica_gpus: int, gpu: GpuSpec,
                   mc: ModelConfig) -> float:
    """The shortest an admission-bound rollout can take on any number of GPUs: every
    response decodes ``max_tokens`` tokens one step at a time, and each step reads the
    replica's weights from HBM at least once, however few sequences each replica holds
    (more GPUs only spread the sequences, the KV-cache reads and the FLOPs)."""
    bw = replica_gpus * gpu.hbm_tbps * 1e12 * mc.decode_bw_efficiency
    return max_tokens * weights_gib(params_b) * GIB / bw


def width_factor(base_gpus: int, gpus: int, floor_fraction: float = 0.0) -> float:
    """A rollout's time on ``gpus`` GPUs over its time on ``base_gpus`` (docs/model.md
    "Rollout width"): the same batch spread over ``gpus / base_gpus`` times the engine
    replicas takes that much less time, because a decode step's cost grows with the
    sequences a replica holds (their KV-cache reads and FLOPs), down to the
    weights-bound floor (``floor_fraction`` of the time on ``base_gpus``,
    :func:`decode_floor_s`); on fewer GPUs the sequences take as much longer (more per
    step, or more waves where the KV cache holds fewer)."""
    if gpus <= 0 or base_gpus <= 0:
        raise ValueError(f"rollout width {gpus} GPUs (base {base_gpus}): expected > 0")
    return max(base_gpus / gpus, min(floor_fraction, 1.0))


def curve_rollout_s(curve: Sequence[tuple[int, float]], gpus: int) -> float:
    """A rollout's time on ``gpus`` GPUs from its measured times on some GPU counts
    (``[profile] rollout_width_s``, GPUs rising): between two counts linear in
    ``1 / gpus`` (exact for a part that spreads plus a part that does not); below the
    fewest GPUs linear in them, as :func:`width_factor`; above the most, no faster than
    the widest measured (nothing says more GPUs would help)."""
    if gpus <= 0:
        raise ValueError(f"rollout width {gpus} GPUs: expected > 0")
    (g0, t0), (gn, tn) = curve[0], curve[-1]
    if gpus <= g0:
        return t0 * g0 / gpus
    if gpus >= gn:
        return tn
    for (ga, ta), (gb, tb) in itertools.pairwise(curve):
        if ga <= gpus <= gb:
            return ta + (tb - ta) * (1 / gpus - 1 / ga) / (1 / gb - 1 / ga)
    raise AssertionError("a GPU count between the curve's ends lies between two of them")


def train_flops(spec: JobSpec) -> float:
    """FLOPs of one training step: actor update plus the forward passes RL needs."""
    n = spec.model.params_b * 1e9
    tokens = spec.rollout.sequences * (spec.rollout.prompt_tokens + mean_response_tokens(spec))
    flops = spec.training.epochs * 6 * n * tokens  # actor forward + backward
    flops += 2 * n * tokens  # old-policy log-probs
    if spec.algorithm is not Algorithm.DAPO:
        flops += 2 * n * tokens  # reference-model log-probs for the KL term
    if spec.algorithm.has_critic:
        flops += spec.training.epochs * 6 * n * tokens + 2 * n * tokens  # critic
    return flops


def estimate_train_s(spec: JobSpec, gpu: GpuSpec, gpus: int, mc: ModelConfig) -> float:
    return train_flops(spec) / (gpus * gpu.bf16_tflops * 1e12 * mc.train_mfu)


def train_state_gib(spec: JobSpec) -> float:
    """Whole training state (all ranks): actor, reference model, critic if any."""
    n = spec.model.params_b * 1e9
    total = TRAIN_BYTES_PER_PARAM * n
    if spec.algorithm is not Algorithm.DAPO:
        total += BF16_BYTES * n
    if spec.algorithm.has_critic:
        total += TRAIN_BYTES_PER_PARAM * n
    return total / GIB


def activation_gib(spec: JobSpec) -> float:
    """Activations of one training micro-batch on one rank, in GiB: with activation
    checkpointing only every layer's input is kept for the backward pass, 2 bytes x
    hidden per token and layer (Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models": ``2sbhL`` with full recomputation). The
    micro-batch is one sequence at full length (prompt + ``max_response_tokens``), the
    smallest a trainer runs: a floor (the recomputed layer and the logits come on top)."""
    m = spec.model
    per_token = (BF16_BYTES * m.layers * m.hidden if m.layers and m.hidden
                 else ACT_BYTES_PER_TOKEN_PER_B * m.params_b)
    return (spec.rollout.prompt_tokens + spec.rollout.max_response_tokens) * per_token / GIB


def train_gpu_peak_gib(spec: JobSpec, ranks: int) -> float:
    """A training rank's device memory while it trains, in GiB: the training state
    (:func:`train_state_gib`) sharded over the ``ranks`` (ZeRO-3 / FSDP, as the state
    per node assumes), one micro-batch's activations and what the process holds anyway
    (:data:`DEVICE_RESIDENT_GIB`)."""
    return train_state_gib(spec) / ranks + activation_gib(spec) + DEVICE_RESIDENT_GIB


def rollout_gpu_peak_gib(est: RolloutEstimate) -> float:
    """An engine GPU's device memory while it generates, in GiB: its weight shard and
    KV cache (:func:`estimate_rollout`: every sequence at full length, capped so that
    weights + KV cache stay within :data:`HBM_UTILIZATION` of the GPU, vLLM's
    ``gpu_memory_utilization``) and what the process holds anyway."""
    return est.state_gib_per_gpu + DEVICE_RESIDENT_GIB


def sync_seconds(inter_gib: float, intra_gib: float, net: NetworkConfig) -> float:
    """Two-tier sync: one copy over the inter-pool link, then an intra-pool all-gather."""
    gbit = 8 * GIB / 1e9
    return inter_gib * gbit / net.inter_pool_gbps + intra_gib * gbit / net.intra_pool_gbps
