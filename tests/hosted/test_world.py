"""A gang's world inside a resident worker, without forming one: a single rank has
none, a gang's rank needs a rendezvous, a worker never joins a second world, and a
single rank keeps its own batch."""

from __future__ import annotations

import pytest

import weave_slurm.hosted.world as world_mod
from weave_slurm.errors import StateError
from weave_slurm.hosted.contract import PhaseArgs
from weave_slurm.hosted.world import World, gang_world, share_batch

ARGS = PhaseArgs("builtin:grpo-toy", 0, {})
AT = "tcp://10.0.0.1:29517"


def _rank(rank: int = 1, world_size: int = 4, init_method: str | None = AT) -> PhaseArgs:
    return PhaseArgs("builtin:grpo-toy", 0, {}, rank=rank, local_rank=rank % 2,
                     world_size=world_size, init_method=init_method, job_id="j")


def _held(init_method: str = AT, rank: int = 1, world_size: int = 4) -> World:
    return World(init_method, rank, world_size, "cpu", object())   # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def no_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts in a worker that joined no world (and leaves none behind)."""
    monkeypatch.setattr(world_mod, "_WORLD", None)


def test_a_single_rank_has_no_world() -> None:
    assert gang_world(ARGS, "train") is None
    assert gang_world(_rank(0, 1, None), "train") is None
    assert world_mod._WORLD is None


def test_a_gangs_rank_without_a_rendezvous_is_refused() -> None:
    with pytest.raises(StateError) as err:
        gang_world(_rank(2, 4, None), "train j.r2")
    assert str(err.value) == ("train j.r2: rank 2 of a gang of 4 has no rendezvous "
                              "(init_method)")


def test_a_world_is_never_joined_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(world_mod, "_WORLD", _held("tcp://10.0.0.1:29400"))
    with pytest.raises(StateError, match="never joined twice") as err:
        gang_world(_rank(1, 4, AT), "train")
    assert str(err.value) == (
        "train: this worker is rank 1 of 4 at tcp://10.0.0.1:29400; the phase wants rank 1 "
        f"of 4 at {AT} (a world is never joined twice)")


@pytest.mark.parametrize(("rank", "world_size"), [(2, 4), (1, 2)])
def test_another_place_in_the_same_rendezvous_is_refused_too(
        monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int) -> None:
    monkeypatch.setattr(world_mod, "_WORLD", _held(AT, 1, 4))
    with pytest.raises(StateError, match="never joined twice"):
        gang_world(_rank(rank, world_size, AT), "train")


def test_the_world_already_joined_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    held = _held(AT, 1, 4)
    monkeypatch.setattr(world_mod, "_WORLD", held)
    assert gang_world(_rank(1, 4, AT), "train") is held


def test_a_single_rank_keeps_its_own_batch() -> None:
    batch = {"tokens": [1, 2, 3]}
    assert share_batch(None, batch) is batch
    assert share_batch(None, None) is None
