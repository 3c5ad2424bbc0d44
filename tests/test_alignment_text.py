"""The normaliser's map: each spoken character stands for the span of the written text
it was made from, whole texts and live pieces alike."""

from __future__ import annotations

import re
import time

import pytest

from pipeline.alignment import SpokenText
from pipeline.normalize import StreamNormalizer, normalize_mapped, normalizer_for
from pipeline.normalize.mapping import map_spans


def words_to_sources(text: SpokenText) -> list[tuple[str, str]]:
    """(spoken word, the written span it stands for) for each spoken word."""
    pairs = []
    for match in re.finditer(r"\S+", text):
        first, last = text.spans[match.start()], text.spans[match.end() - 1]
        pairs.append((match.group(), text.source[first[0] : last[1]]))
    return pairs


def test_money_words_stand_for_the_written_amount() -> None:
    text = normalize_mapped("It costs $3.50 today, said Dr. Smith.", "en_US")
    assert str(text) == "It costs three dollars and fifty cents today, said Doctor Smith."
    assert words_to_sources(text) == [
        ("It", "It"),
        ("costs", "costs"),
        ("three", "$3.50"),
        ("dollars", "$3.50"),
        ("and", "$3.50"),
        ("fifty", "$3.50"),
        ("cents", "$3.50"),
        ("today,", "today,"),
        ("said", "said"),
        ("Doctor", "Dr."),
        ("Smith.", "Smith."),
    ]


def test_numbers_and_unchanged_words_map_in_order() -> None:
    text = normalize_mapped("I have 2 dogs and two cats; in 1995 we had 23.", "en_US")
    assert words_to_sources(text) == [
        ("I", "I"),
        ("have", "have"),
        ("two", "2"),
        ("dogs", "dogs"),
        ("and", "and"),
        ("two", "two"),
        ("cats;", "cats;"),
        ("in", "in"),
        ("nineteen", "1995"),
        ("ninety-five", "1995"),
        ("we", "we"),
        ("had", "had"),
        ("twenty-three.", "23."),
    ]
    # unchanged words stand for themselves character by character
    start = text.index("dogs")
    assert text.spans[start : start + 4] == tuple((i, i + 1) for i in range(9, 13))


def test_an_added_word_joins_the_one_before_it() -> None:
    text = normalize_mapped("That is $5 million now.", "en_US")
    assert str(text) == "That is five million dollars now."
    assert words_to_sources(text)[2:] == [
        ("five", "$5"),
        ("million", "million"),
        ("dollars", "million"),
        ("now.", "now."),
    ]
    # where the words around it changed too, the whole region stands for the whole span
    text = normalize_mapped("That is $5 million.", "en_US")
    assert str(text) == "That is five million dollars."
    assert {source for _, source in words_to_sources(text)[2:]} == {"$5 million."}


def test_spans_are_in_order_and_spaces_stand_for_nothing() -> None:
    for written in [
        "Call 555-1234 or visit https://example.com/path now.",
        "😀 Hello   world 🎉 -- at 3:30 pm on 2024-01-05!",
        "",
    ]:
        text = normalize_mapped(written, "en_US")
        assert text.source == written
        said = [span for char, span in zip(text, text.spans, strict=True) if char != " "]
        assert [a for a, _ in said] == sorted(a for a, _ in said)
        assert all(0 <= a < b <= len(written) for a, b in said)
        assert all(a == b for char, (a, b) in zip(text, text.spans, strict=True) if char == " ")


def test_normalisation_off_maps_each_character_to_itself() -> None:
    text = SpokenText.verbatim("A $3 tip.")
    assert text.spans == tuple((i, i + 1) for i in range(9))
    mapped = map_spans("A $3 tip.", "A $3 tip.")
    assert [s for c, s in zip(text, mapped, strict=True) if c != " "] == [
        s for c, s in zip(text, text.spans, strict=True) if c != " "
    ]


def test_joined_spoken_texts_keep_their_maps() -> None:
    first = normalize_mapped("Pay $3.50", "en_US")
    second = SpokenText(" now", " now", ((0, 0), (1, 2), (2, 3), (3, 4)))
    joined = first + second
    assert isinstance(joined, SpokenText)
    assert joined.source == "Pay $3.50 now"
    assert words_to_sources(joined)[1] == ("three", "$3.50")
    assert words_to_sources(joined)[-1] == ("now", "now")
    # a plain str joined on stands for itself
    assert words_to_sources(joined + " too")[-1] == ("too", "too")
    assert (joined + " too").source == "Pay $3.50 now too"


def test_spoken_text_rejects_a_map_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="spans"):
        SpokenText("abc", "abc", ((0, 1),))


def test_live_pieces_have_sources_that_join_to_the_text_pushed() -> None:
    rules = normalizer_for("en_US")
    assert rules is not None
    normalizer = StreamNormalizer(rules)
    pieces = ["It costs $3.", "50 today. ", "In 19", "95 we had 23 cats 🐱 and ", "two dogs."]
    out = [normalizer.push(piece) for piece in pieces] + [normalizer.flush()]
    assert all(isinstance(piece, SpokenText) for piece in out)
    assert "".join(piece.source for piece in out) == "".join(pieces)
    spoken = " ".join(" ".join(str(piece).split()) for piece in out if piece.strip())
    assert "three dollars and fifty cents" in spoken
    assert "nineteen ninety-five" in spoken
    # the money words of the first settled piece stand for "$3.50", across the two pushes
    settled = next(piece for piece in out if "dollars" in piece)
    assert ("dollars", "$3.50") in words_to_sources(settled)


def test_a_long_repetitive_text_maps_quickly_and_right_to_its_end() -> None:
    """The word walk stays about linear (difflib's matcher over the whole text took minutes
    on this one), and repeated words do not pair across sentences."""
    sentence = "It costs $3.50 today, said Dr. Smith in 1995. "
    text = sentence * 300
    started_s = time.perf_counter()
    mapped = normalize_mapped(text, "en_US")
    assert time.perf_counter() - started_s < 5.0
    pairs = words_to_sources(mapped)
    assert len(pairs) == 300 * 14
    last = pairs[-14:]
    assert last[2:7] == [(word, "$3.50") for word in ["three", "dollars", "and", "fifty", "cents"]]
    assert last[-2:] == [("nineteen", "1995."), ("ninety-five.", "1995.")]
    # the first and the last "three dollars" stand for the first and the last "$3.50"
    last_sentence = len(text) - len(sentence)
    assert mapped.spans[mapped.index("three dollars")] == (9, 14)
    assert mapped.spans[mapped.rindex("three dollars")] == (last_sentence + 9, last_sentence + 14)
