"""The distill manual stays a manual: at most 250 lines, and no number in its prose beside names (a section, a bit
width, an exit code, a table, a ZeRO stage); settings and measurements live in the commands' ``--help``, the presets
and docs/distill-reference.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANUAL = ROOT / "distill" / "README.md"
#: Numbers that are part of a name, not a quantity: NF4, bf16, Qwen3-VL, §5.1, 4-bit, exit 1, Table 10, ZeRO-2/3.
NAMES = re.compile(r"\b[A-Za-z]+\d\w*|§\d+(?:\.\d+)*|\b\d+-bit\b|\bexit \d\b|\bTable \d+\b|\bZeRO-\d(?:/\d)?")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code, with inline code and link targets removed (commands and paths carry numbers)."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((i, re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", line))))
    return out


def test_manual_is_short_and_states_no_numbers():
    text = MANUAL.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    numbers = [(i, line.strip()) for i, line in _prose_lines(text) if re.search(r"\d", NAMES.sub("", line))]
    assert numbers == [], "numbers in distill/README.md: generate them with a command or move them to its help"
    assert "docs/distill-reference.md" in text and (ROOT / "docs" / "distill-reference.md").is_file()
