"""The docs harness itself (tests/docs/shell.py, sessions.py, blocks.py) fails a block
whose command fails, and carries a session's state from block to block; what a page
runs in place of a block it cannot run is what that block would run."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from tests.docs.blocks import DocBlock, doc_blocks
from tests.docs.sessions import Sessions, run_block, user_env


def _block(code: str, expected: str | None = None, line: int = 1) -> DocBlock:
    return DocBlock("PAGE.md", "a section", line, "bash", code, expected)


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Sessions]:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    s = Sessions(tmp_path / "s", {"PAGE.md": cwd}, user_env())
    yield s
    s.close()


def test_a_failing_command_in_the_middle_of_a_block_fails_it(page: Sessions) -> None:
    with pytest.raises(AssertionError, match=r"line 2: exit 3: "):
        run_block(page, _block("true\n(exit 3)\necho still typed\n"))


def test_a_session_keeps_exports_cwd_and_jobs_between_blocks(page: Sessions) -> None:
    run_block(page, _block("export GREETING=hi\nmkdir sub && cd sub\nsleep 60 &\n"))
    out = run_block(page, _block('echo "$GREETING $(basename $PWD)"\nkill %1; wait %1 || true\n',
                                 line=2))
    assert out == "hi sub\n"


def test_an_output_other_than_the_page_shows_fails(page: Sessions) -> None:
    run_block(page, _block("echo built\n", expected="built\n"))
    with pytest.raises(AssertionError, match="where the page shows"):
        run_block(page, _block("echo built elsewhere\n", expected="built\n", line=2))


def test_a_venv_of_the_test_run_is_not_on_a_users_path() -> None:
    assert ".venv/bin" not in user_env()["PATH"]


def test_every_block_of_readme_and_deploy_is_collected_with_its_skip_reason() -> None:
    blocks = doc_blocks("README.md", {"bash"}) + doc_blocks("docs/deploy.md", {"bash"})
    skipped = [p for p in blocks if any(m.name == "skip" for m in p.marks)]
    assert len(blocks) >= 10 and all(m.kwargs.get("reason") for p in skipped for m in p.marks)
    make = blocks[0].values[0]
    assert make.code.startswith("make demo") and blocks[0] in skipped


def _daemon_flags(text: str) -> list[str]:
    words = shlex.split(text.replace("\\\n", " "))
    start = words.index("daemon") + 1
    return [w for w in words[start:] if w != "&"]


def test_deploys_weaved_by_hand_has_the_units_flags() -> None:
    """docs/deploy.md starts weaved by hand (no systemd in CI) with its unit's command."""
    unit = (resources.files("weave_slurm") / "deploy" / "weaved.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.M | re.S)
    assert exec_start is not None
    by_hand = [p.values[0].code for p in doc_blocks("docs/deploy.md", {"bash"})
               if "weave daemon --backend slurm" in p.values[0].code]
    assert len(by_hand) == 1
    line = by_hand[0][by_hand[0].index("weave daemon"):].split("&")[0]
    assert _daemon_flags(line) == _daemon_flags(exec_start.group(1))


def test_every_block_of_recipes_runs_or_says_where_and_why_not() -> None:
    """docs/recipes.md: the spec lines run here (test_job_api_examples); the Ray pattern's
    driver loop is skipped here with the test that runs it as written; verl's outline
    is skipped with why (it needs verl and GPUs)."""
    blocks = [p for p in doc_blocks("docs/recipes.md", {"python", "toml", "bash", "sh"})]
    reasons = {p.values[0].syntax + ":" + p.values[0].section:
               [m.kwargs.get("reason") for m in p.marks if m.name == "skip"] for p in blocks}
    assert reasons["toml:The shape both share"] == []
    (ray_loop,) = reasons["python:The shape both share"]
    assert "tests/daemon/test_ray_slurm.py" in ray_loop
    (verl,) = reasons["python:verl"]
    assert "verl" in verl and "GPU" in verl
    assert len(blocks) == 3
