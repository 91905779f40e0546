"""Marks that render in every browser: emoji (a green tick, a red cross, a pencil) are empty boxes in a
chromium without an emoji font (Debian's), so messages, widgets and notebooks use ✓ ✗ ⚠ ℹ ○ instead."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Emoji blocks, the dingbats drawn as emoji (U+2705, U+274C, U+270F...) and the emoji presentation selector.
EMOJI = re.compile("[\U0001F300-\U0001FAFF\u2705\u2714\u2716\u274C\u274E\u2728\u270F\u2B50\uFE0F]")
FILES = sorted([*ROOT.glob("workbench/**/*.py"), *ROOT.glob("widgets/**/*.py"), *ROOT.glob("widgets/*.ipynb"),
                *ROOT.glob("notebooks/*.ipynb"), ROOT / "README.md"])


@pytest.mark.parametrize("path", FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_emoji_marks(path):
    found = [(number, line.strip()[:80]) for number, line in enumerate(path.read_text().splitlines(), 1)
             if EMOJI.search(line)]
    assert found == []


def test_the_workshop_marks_are_plain_characters():
    from workbench.workshop import _MARKS

    assert [mark.split()[0] for mark in _MARKS.values()] == ["✓", "✗", "○"]
