"""The code blocks of a Markdown page, as pytest parameters (one test id per block).

The blocks and their marks come from pytest-codeblocks (``extract_from_file``): a block
is skipped by an HTML comment right above it that a reader of the Markdown source sees,
``<!--pytest.mark.skip(reason="why")-->``, and ``<!--pytest-codeblocks:expected-output-->``
makes the next block the output the one before must print. This module adds what the
library does not know: the section each block stands in (its nearest heading, from
markdown-it-py), so that the blocks of one section run in one shell session.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from pytest_codeblocks import extract_from_file

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DocBlock:
    doc: str                  # path relative to the repository root
    section: str              # the nearest heading above the block
    lineno: int               # the line of its opening fence (1-based)
    syntax: str               # the fence's info string: bash, sh, python, toml, ...
    code: str
    expected_output: str | None
    expected_output_ignore_whitespace: bool = False
    importorskip: str | None = None   # a module the block needs (pytest-codeblocks' mark)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.lineno}"


def _headings(path: Path) -> list[tuple[int, str]]:
    """(first line, 1-based; text) of every heading of the page, in order."""
    tokens = MarkdownIt().parse(path.read_text())
    out = []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.map is not None:
            out.append((tok.map[0] + 1, tokens[i + 1].content))
    return out


def _section(headings: list[tuple[int, str]], lineno: int) -> str:
    above = [text for line, text in headings if line < lineno]
    return above[-1] if above else ""


def _marks(texts: list[str]) -> list[Any]:
    # pytest-codeblocks' own plugin evaluates its marks the same way
    return [eval(t, {"sys": sys, "pytest": pytest}) for t in texts]


def doc_blocks(doc: str, syntaxes: set[str]) -> list[Any]:
    """One ``pytest.param`` per block of ``doc`` whose fence says one of ``syntaxes``,
    id ``<doc>:<line>``, carrying the block's marks."""
    path = REPO / doc
    heads = _headings(path)
    params = []
    for b in extract_from_file(path):
        syntax = (b.syntax or "").strip()
        if syntax not in syntaxes:
            continue
        block = DocBlock(doc, _section(heads, b.lineno), b.lineno, syntax, b.code,
                         b.expected_output, b.expected_output_ignore_whitespace, b.importorskip)
        params.append(pytest.param(block, id=block.where, marks=_marks(b.marks)))
    return params
