"""The shared words and how a user's spelling of an enum value is read."""

from __future__ import annotations

import enum
from collections.abc import Callable

import pytest

from weave_slurm.errors import ConfigError
from weave_slurm.vocab import Phase, Pool, member_of


class _Plain(enum.Enum):   # not a StrEnum: values compared as strings too
    ONE = "one"
    TWO = "two"


def test_members_are_found_by_value_and_by_their_string() -> None:
    assert Pool.parse("rollout") is Pool.ROLLOUT
    assert Pool.parse(Pool.TRAIN) is Pool.TRAIN
    assert Phase.parse("sync") is Phase.SYNC
    assert member_of(_Plain, "two", "{value}") is _Plain.TWO


@pytest.mark.parametrize(("call", "words"), [
    (lambda: Pool.parse("gpu", "pools.gpu"),
     "pools.gpu 'gpu' is unknown; valid: rollout, train"),
    (lambda: Phase.parse(3), "phase 3 is unknown; valid: rollout, sync, train"),
    (lambda: member_of(_Plain, "three", "--plain {value}: valid choices: {choices}"),
     "--plain 'three': valid choices: one, two"),
])
def test_an_unknown_value_is_one_line_naming_the_key_and_the_choices(
        call: Callable[[], object], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        call()
    assert str(err.value) == words
