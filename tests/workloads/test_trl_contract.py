"""Contract tests of the TRL private API the adapter (weave_slurm/workloads/trl_grpo.py)
relies on. Each fails with a message naming what changed in the installed TRL; the
last one checks that the adapter's training step *is* TRL's own: ``Trainer.train`` on
the same generation batch reaches the same weights."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from transformers import Trainer, TrainerCallback  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

from weave_slurm.workloads import trl_tiny  # noqa: E402
from weave_slurm.workloads.api import JobContext, Role  # noqa: E402
from weave_slurm.workloads.trl_grpo import (  # noqa: E402
    BATCH_KEYS,
    RECOMPUTED,
    TESTED_TRL,
    TrlGrpoJob,
)

pytestmark = pytest.mark.torch
WHERE = "trl/trainer/grpo_trainer.py"
OPTIONS: dict[str, Any] = {"prompts_per_step": 2, "max_steps": 5}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    yield


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_installed_trl_is_the_pinned_release() -> None:
    got = tuple(int(p) for p in trl.__version__.split(".")[:2])
    assert got == TESTED_TRL, (
        f"trl {trl.__version__} is installed, the TRL adapter is pinned to "
        f"{TESTED_TRL}: re-read {WHERE} and update trl_grpo.py and TESTED_TRL")


def test_the_private_methods_keep_their_signatures() -> None:
    want = {
        "GRPOTrainer._generate_and_score_completions": (
            GRPOTrainer._generate_and_score_completions, ["self", "inputs"]),
        "GRPOTrainer.compute_loss": (
            GRPOTrainer.compute_loss,
            ["self", "model", "inputs", "return_outputs", "num_items_in_batch"]),
        "Trainer.create_optimizer_and_scheduler": (
            Trainer.create_optimizer_and_scheduler, ["self", "num_training_steps"]),
        "Trainer.compute_loss_context_manager": (
            Trainer.compute_loss_context_manager, ["self"]),
    }
    for name, (fn, params) in want.items():
        assert _params(fn) == params, (f"{name} now takes {_params(fn)}, the TRL adapter "
                                       f"calls it as {params} ({WHERE})")


def test_the_loss_reads_what_the_adapter_sets() -> None:
    src = inspect.getsource(GRPOTrainer._compute_loss)
    for needle in ("self.current_gradient_accumulation_steps", 'inputs["num_items_in_batch"]',
                   "self.entropy_coef", "self._last_world_entropy"):
        assert needle in src, (f"GRPOTrainer._compute_loss no longer reads {needle}: the "
                               f"TRL adapter sets or saves it ({WHERE})")
    # training_step regenerates through _prepare_inputs, which is why the adapter calls
    # compute_loss itself
    assert "_generate_and_score_completions" in inspect.getsource(GRPOTrainer._prepare_inputs)


def test_a_built_trainer_has_the_attributes_the_adapter_uses() -> None:
    tr = trl_tiny.build(JobContext("c", Role.TRAIN, 0, OPTIONS))
    for name in ("_metrics", "entropy_coef", "_last_world_entropy", "num_generations",
                 "shuffle_dataset", "ref_model", "train_dataset", "accelerator", "state"):
        assert hasattr(tr, name), f"GRPOTrainer has no attribute {name!r} any more ({WHERE})"
    for name in ("steps_per_generation", "generation_batch_size", "num_iterations",
                 "use_vllm", "max_grad_norm", "gradient_accumulation_steps"):
        assert hasattr(tr.args, name), f"GRPOConfig has no field {name!r} any more"
    assert set(tr._metrics) == {"train", "eval"}


def test_the_generation_batch_holds_the_known_tensors() -> None:
    job = TrlGrpoJob(trl_tiny.build)
    job.setup(JobContext("c", Role.ROLLOUT, 0, OPTIONS))
    tr = job.trainer
    inputs = [dict(tr.train_dataset[i]) for i in (0, 1) for _ in range(tr.num_generations)]
    out = tr._generate_and_score_completions(inputs)
    unknown = sorted(set(out) - set(BATCH_KEYS) - set(RECOMPUTED))
    assert unknown == [], f"_generate_and_score_completions returns new keys {unknown}"
    rows = 2 * tr.num_generations
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        assert out[key].shape[0] == rows, key
    assert out["advantages"].shape == (rows,)
    assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())
    assert "reward" in tr._metrics["train"]


class _StopAfterOne(TrainerCallback):  # type: ignore[misc]
    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        control.should_training_stop = True
        return control


@pytest.mark.parametrize(("accumulation", "optim"),
                         [(1, "adamw_torch_fused"), (2, "adamw_torch_fused"), (2, "sgd")])
def test_an_update_is_trls_own_optimizer_step(accumulation: int, optim: str) -> None:
    """TRL's ``train()``, its generation replaced by the adapter's batch, takes one
    optimizer step (``accumulation`` micro-batches) to the weights the adapter's
    ``update`` reaches, up to float sums: the two shuffle the rows differently.
    Observed (float32): Adam 1.2e-7 (1 micro-batch), 3.3e-7 (2); SGD at lr 0.5 7.5e-9. (TRL's
    default bf16 autocast: two partitions of a batch differ by ~0.4 % of a gradient,
    which is why the example trains in float32.)"""
    opts = {**OPTIONS, "prompts_per_step": 2 * accumulation,
            "learning_rate": 1e-3 if optim != "sgd" else 0.5}

    def build(ctx: JobContext) -> Any:
        tr = trl_tiny.build(ctx)
        tr.args.optim = optim
        tr.args.gradient_accumulation_steps = accumulation
        tr.args.steps_per_generation = accumulation
        tr.args.per_device_train_batch_size //= accumulation
        tr.args.disable_tqdm = True
        return tr

    roll, train = TrlGrpoJob(build), TrlGrpoJob(build)
    roll.setup(JobContext("c", Role.ROLLOUT, 3, opts))
    train.setup(JobContext("c", Role.TRAIN, 3, opts))
    batch = roll.generate(0)
    metrics = train.update(batch)

    own = build(JobContext("c", Role.TRAIN, 3, opts))
    fed = {**batch.tensors, "num_items_in_batch": batch.tensors["completion_mask"].sum()}
    own._generate_and_score_completions = lambda inputs: dict(fed)
    own.add_callback(_StopAfterOne())
    own.train()
    assert own.state.global_step == 1
    mine = train.export_weights()
    theirs = own.model.state_dict()
    worst = max(float((mine[k] - theirs[k]).abs().max()) for k in mine)
    moved = max(float((mine[k] - roll.export_weights()[k]).abs().max()) for k in mine)
    assert moved > 1e-4, "the step changed nothing: the test would prove nothing"
    assert worst < 1e-6, f"the adapter's step differs from TRL's by {worst}"
    assert metrics["learning_rate"] == pytest.approx(own.lr_scheduler.get_last_lr()[0])
