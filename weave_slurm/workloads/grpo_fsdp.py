"""Training gangs of the reference job: the policy sharded with FSDP2 over the gang's group.

With ``world_size > 1`` on the training role, :class:`~weave_slurm.workloads.grpo_toy.GrpoToyJob`
hands its training to a :class:`FsdpTrainer`. The policy and the frozen reference are
sharded with ``torch.distributed.fsdp.fully_shard`` (each decoder layer, then the root)
on a device mesh over the context's group (``DeviceMesh.from_group``: no new group is
made), so each rank's local shard holds ``1/W`` of every weight (dim 0, cut as
``torch.chunk`` cuts it: :func:`~weave_slurm.workloads.gang_api.chunk_bounds`).

Data parallel: each rank trains on its share of every minibatch's rows. A rank's loss
is its rows' part of the minibatch's token mean (a sum over its tokens divided by the
whole minibatch's token count, which every rank knows: all hold the whole batch), and
the gradients are summed over the gang (reduce-scatter with SUM and a divide factor
of 1; gloo has no PREMUL_SUM). So a step is the single-rank step up to the order of
float sums: a linear layer's weight gradient sums over rows, here in ``W`` partial sums
that the reduce-scatter adds, and the gradient norm sums ``W`` shards' squares; Adam
turns those last-bit differences into small weight differences (docs/job_api.md,
"Gangs", gives the tolerance). Runs of the same world size do the same sums in the
same order: they are bit-identical.

Warm state per rank: its shards of ``policy.*``, ``reference.*`` and the Adam moments
(``optim.*``), plus ``gang.rank`` and ``gang.world_size``. ``load_state`` takes the
same rank's state of the same world size or, with ``options.reshard``, a full
(single-rank) state, of which each rank keeps its rows; :func:`merge_state_shards`
turns the per-rank states of a gang into that full state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from weave_slurm.errors import ConfigError, StateError
from weave_slurm.workloads.api import JobContext
from weave_slurm.workloads.gang_api import WeightShard, chunk_bounds, pack_shard
from weave_slurm.workloads.grpo import action_logprobs, grpo_loss
from weave_slurm.workloads.grpo_model import sub_tensors
from weave_slurm.workloads.grpo_options import GrpoToyOptions

if TYPE_CHECKING:
    from torch import Tensor, nn
    from torch.distributed.device_mesh import DeviceMesh

GANG_RANK = "gang.rank"
GANG_WORLD = "gang.world_size"
#: Prefixes of the warm-state tensors a gang shards on dim 0 (those with a dim 0).
SHARDED_PREFIXES = ("policy.", "reference.", "optim.")
_METRICS = ("policy_loss", "kl", "clip_frac", "loss")


def shard_world(tensors: Mapping[str, Tensor]) -> int:
    """Over how many training ranks a warm state is sharded (1: a full state)."""
    return int(tensors[GANG_WORLD].item()) if GANG_WORLD in tensors else 1


def gang_refusal(job_id: str, got: int, rank: int, own: int) -> str:
    """The one-line reason a warm state sharded over ``got`` ranks cannot load here."""
    if own > 1 and got == 1:
        hint = "set options.reshard = true to load a full state into a gang"
    else:
        hint = (f"merge the {got} ranks' states with merge_state_shards()"
                + (" and set options.reshard = true" if own > 1 else ""))
    return (f"grpo-toy job {job_id}: warm state is sharded over {got} training rank(s), "
            f"this instance over {own} (rank {rank}): {hint}")


def merge_state_shards(states: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The full (single-rank) warm state from the states of every rank of a gang.

    A tensor with a dim 0 under :data:`SHARDED_PREFIXES` is concatenated in rank order;
    any other must be the same on every rank and is kept once; the gang keys go.
    """
    import torch

    ordered = sorted(states, key=lambda s: int(s[GANG_RANK].item()) if GANG_RANK in s else 0)
    world = {shard_world(s) for s in ordered}
    ranks = [int(s[GANG_RANK].item()) if GANG_RANK in s else 0 for s in ordered]
    if len(world) != 1 or ranks != list(range(len(ordered))) or world != {len(ordered)}:
        raise StateError(f"merge_state_shards: need the states of ranks 0..N-1 of one gang, "
                         f"got ranks {ranks} of gangs of {sorted(world)}")
    out: dict[str, Tensor] = {}
    for key in ordered[0]:
        if key in (GANG_RANK, GANG_WORLD):
            continue
        values = [s[key] for s in ordered]
        if key.startswith(SHARDED_PREFIXES) and values[0].dim() >= 1:
            out[key] = torch.cat(values, dim=0)
        elif all(torch.equal(v, values[0]) for v in values):
            out[key] = values[0].clone()
        else:
            raise StateError(f"merge_state_shards: {key!r} differs between the ranks")
    return out


class FsdpTrainer:
    """The training side of one rank of a gang: sharded policy and reference, Adam."""

    def __init__(self, ctx: JobContext, opts: GrpoToyOptions, policy: nn.Module,
                 reference: nn.Module) -> None:
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        rows = opts.prompts_per_step * opts.group_size // opts.minibatches
        if ctx.group is None:
            raise ConfigError(f"grpo-toy job {ctx.job_id}: a training gang of "
                              f"{ctx.world_size} ranks needs the gang's process group "
                              "(JobContext.group)")
        if torch.device(ctx.device).type != "cpu":
            raise ConfigError(f"grpo-toy job {ctx.job_id}: the reference job trains on the "
                              f"CPU (device 'cpu'), got device {ctx.device!r}")
        if rows < ctx.world_size:
            raise ConfigError(f"options.minibatches: a minibatch of {rows} rows leaves ranks "
                              f"of a gang of {ctx.world_size} without a row")
        self._ctx, self._opts = ctx, opts
        mesh = DeviceMesh.from_group(ctx.group, device_type="cpu")
        for model in (policy, reference):
            _shard(model, mesh)
        self.policy, self.reference = policy, reference
        self.optim = torch.optim.Adam(policy.parameters(), lr=opts.lr)

    # -- one training step ---------------------------------------------------------
    def train_batch(self, tokens: Tensor, responses: Tensor, adv: Tensor,
                    mask: Tensor | None, action_ids: Tensor) -> dict[str, float]:
        """GRPO over the minibatches of a batch that every rank holds whole; each rank
        trains on its share of each minibatch's rows. Returns the gang's metrics."""
        import torch
        import torch.distributed as dist

        opts, hyper = self._opts, self._opts.hyper
        per_mb = tokens.shape[0] // opts.minibatches
        lo, hi = self._ctx.share(per_mb)
        spans = [(i * per_mb + lo, i * per_mb + hi) for i in range(opts.minibatches)]
        mine = torch.cat([torch.arange(a, b) for a, b in spans])
        with torch.no_grad():
            old_logp = action_logprobs(self.policy, tokens[mine], responses[mine], action_ids)
            ref_logp = action_logprobs(self.reference, tokens[mine], responses[mine],
                                       action_ids)
        sums = torch.zeros(len(_METRICS), dtype=torch.float64)
        for i, (a, b) in enumerate(spans):
            own = slice(i * (hi - lo), (i + 1) * (hi - lo))
            whole = slice(i * per_mb, (i + 1) * per_mb)
            count = (float(per_mb * responses.shape[1]) if mask is None
                     else mask[whole].sum().clamp(min=1.0))
            logp = action_logprobs(self.policy, tokens[a:b], responses[a:b], action_ids)
            loss, metrics = grpo_loss(logp, old_logp[own], ref_logp[own], adv[a:b], hyper,
                                      None if mask is None else mask[a:b], count=count)
            self._step(loss)
            metrics["loss"] = float(loss.detach())
            sums += torch.tensor([metrics[k] for k in _METRICS], dtype=torch.float64)
        dist.all_reduce(sums, group=self._ctx.group)
        return {k: float(v) / opts.minibatches for k, v in zip(_METRICS, sums.tolist(),
                                                                 strict=True)}

    def _step(self, loss: Tensor) -> None:
        import torch

        self.optim.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self._opts.max_grad_norm)
        self.optim.step()

    # -- weights -------------------------------------------------------------------
    def export_full(self) -> dict[str, Tensor]:
        """The full weights on rank 0 (``{}`` on the others). A collective: every rank
        calls it, and gathers one weight at a time."""
        from torch.distributed.tensor import DTensor

        out: dict[str, Tensor] = {}
        for name, t in self.policy.state_dict().items():
            full = t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()
            if self._ctx.rank == 0:
                out[name] = full.detach()
        return out

    def export_shard(self) -> WeightShard:
        """This rank's elements of every weight, flat, with where they belong. Local."""
        from torch.distributed.tensor import DTensor

        rank, world = self._ctx.rank, self._ctx.world_size
        parts = []
        for name, t in self.policy.state_dict().items():
            shape = tuple(int(d) for d in t.shape)
            if isinstance(t, DTensor):
                lo, _ = chunk_bounds(shape[0], world, rank)
                parts.append((name, shape, lo * math.prod(shape[1:]),
                              self._checked_local(name, t)))
            else:   # replicated: rank 0 lists all of it, the others none
                parts.append((name, shape, 0, t if rank == 0 else t.reshape(-1)[:0]))
        return pack_shard(rank, world, parts)

    def _checked_local(self, name: str, t: Tensor) -> Tensor:
        from torch.distributed.tensor import DTensor, Shard

        assert isinstance(t, DTensor)
        local = t.to_local()
        lo, hi = chunk_bounds(int(t.shape[0]), self._ctx.world_size, self._ctx.rank)
        if tuple(t.placements) != (Shard(0),) or local.shape[0] != hi - lo:
            raise StateError(f"grpo-toy job {self._ctx.job_id}: {name} is sharded as "
                             f"{t.placements} with {local.shape[0]} rows here, not as dim-0 "
                             f"chunks ({hi - lo} rows)")
        return local

    # -- warm state ----------------------------------------------------------------
    def state_tensors(self) -> dict[str, Tensor]:
        """This rank's shards of the policy, the reference and Adam, and its place."""
        import torch

        state = {f"policy.{k}": _local(v) for k, v in self.policy.state_dict().items()}
        state.update({f"reference.{k}": _local(v)
                      for k, v in self.reference.state_dict().items()})
        names = [name for name, _ in self.policy.named_parameters()]
        for idx, st in self.optim.state_dict()["state"].items():
            for field_name, value in st.items():
                state[f"optim.{names[idx]}.{field_name}"] = _local(value)
        state[GANG_RANK] = torch.tensor(self._ctx.rank, dtype=torch.int64)
        state[GANG_WORLD] = torch.tensor(self._ctx.world_size, dtype=torch.int64)
        return state

    def load_state(self, tensors: Mapping[str, Tensor]) -> None:
        """Restore :meth:`state_tensors` of this rank, or (``reshard``) a full state."""
        state = self._own_rows(tensors)
        _load_local(self.policy, sub_tensors(state, "policy."), "state policy")
        _load_local(self.reference, sub_tensors(state, "reference."), "state reference")
        self._load_optimizer(sub_tensors(state, "optim."))

    def _own_rows(self, tensors: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
        ctx, got = self._ctx, shard_world(tensors)
        if got == ctx.world_size:
            rank = int(tensors[GANG_RANK].item())
            if rank != ctx.rank:
                raise StateError(f"grpo-toy job {ctx.job_id}: warm state is rank {rank}'s "
                                 f"shard, this instance is rank {ctx.rank} of "
                                 f"{ctx.world_size}")
            return tensors
        if got != 1 or not self._opts.reshard:
            raise StateError(gang_refusal(ctx.job_id, got, ctx.rank, ctx.world_size))
        out = dict(tensors)
        for key, value in tensors.items():
            if key.startswith(SHARDED_PREFIXES) and value.dim() >= 1:
                lo, hi = chunk_bounds(int(value.shape[0]), ctx.world_size, ctx.rank)
                out[key] = value[lo:hi]
        return out

    def _load_optimizer(self, tensors: Mapping[str, Tensor]) -> None:
        from torch.distributed.tensor import DTensor

        sd = self.optim.state_dict()
        state: dict[int, dict[str, Tensor]] = {}
        for idx, (name, param) in enumerate(self.policy.named_parameters()):
            prefix = f"{name}."
            fields_ = {k[len(prefix):]: v for k, v in tensors.items()
                       if k.startswith(prefix) and "." not in k[len(prefix):]}
            if not fields_:
                continue
            state[idx] = {}
            for field_name, value in fields_.items():
                if value.dim() and isinstance(param, DTensor):
                    _check_shape(f"optim {name}.{field_name}", value, param.to_local())
                    state[idx][field_name] = DTensor.from_local(
                        value.clone(), param.device_mesh, param.placements, shape=param.shape,
                        stride=param.stride(), run_check=False)
                else:
                    state[idx][field_name] = value.clone()
        sd["state"] = state
        self.optim.load_state_dict(sd)


def _shard(model: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2 over ``mesh``: each decoder layer, then the root; gradients summed."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(1.0)


def _local(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def _check_shape(what: str, got: Tensor, local: Tensor) -> None:
    if got.shape != local.shape:
        raise StateError(f"grpo-toy {what}: {list(got.shape)}, this rank's shard is "
                         f"{list(local.shape)}")


def _load_local(module: nn.Module, tensors: Mapping[str, Tensor], what: str) -> None:
    """Copy this rank's shards into ``module``'s (sharded) parameters, in place."""
    import torch
    from torch.distributed.tensor import DTensor

    params = module.state_dict(keep_vars=True)
    missing, extra = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
    if missing or extra:
        raise StateError(f"grpo-toy {what}: keys do not match the model "
                         f"(missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for name, param in params.items():
            local = param.to_local() if isinstance(param, DTensor) else param
            _check_shape(f"{what} {name}", tensors[name], local)
            local.copy_(tensors[name])
