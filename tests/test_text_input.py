"""The one front door for text (app/text_input.py) that every protocol's adapter reads."""

from __future__ import annotations

import pytest

from app.text_input import INLINE_NORMALIZE_MAX_CHARS, has_nul, normalized, words_apart


def test_control_characters_separate_words_and_whitespace_stays() -> None:
    assert words_apart("one\x07two\x0cthree\x7ffour\x85five") == "one two three four five"
    assert words_apart("tab\there\nnewline\r\nreturn") == "tab\there\nnewline\r\nreturn"


def test_nul_is_not_text() -> None:
    assert has_nul("a\x00b")
    assert not has_nul("a\x01b")


@pytest.mark.parametrize("repeat", [1, INLINE_NORMALIZE_MAX_CHARS])  # inline, then a thread
async def test_normalized_keeps_the_map_to_the_text_as_sent(repeat: int) -> None:
    text = " ".join(["It costs $3.50."] * repeat)
    spoken = await normalized(text, "en_US", None)
    assert spoken.startswith("It costs three dollars and fifty cents.")
    assert spoken.source == text
