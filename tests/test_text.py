"""Text segmentation: short first fragment, sentences, clause splits, nothing lost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.text import Segmenter, estimated_phonemes, split_text


def test_first_fragment_is_the_first_clause() -> None:
    segments = split_text(
        "Well then, we should all go home before the rain starts. Fine.", first_fragment_words=6
    )
    assert segments == ["Well then,", "we should all go home before the rain starts.", "Fine."]


def test_a_long_first_sentence_without_a_clause_end_is_not_cut() -> None:
    # no natural pause: the sentence stays whole (a cut between two words the voice would
    # join adds a pause and a sentence-final intonation)
    text = "The quick brown fox jumps over the lazy dog today. It sleeps."
    assert split_text(text, first_fragment_words=4) == [
        "The quick brown fox jumps over the lazy dog today.",
        "It sleeps.",
    ]
    # a clause end that would leave a one-word remainder is no cut either
    text = "The quick brown fox jumps over the lazy dog, today. It sleeps."
    assert split_text(text, first_fragment_words=4)[0] == (
        "The quick brown fox jumps over the lazy dog, today."
    )


def test_the_first_clause_end_is_the_cut_wherever_it_falls() -> None:
    # the whole first segment is encoded before its first frames: a clause end after the
    # first 13 words still makes the first fragment shorter than the sentence
    text = (
        "When the old lighthouse keeper finally climbed the narrow spiral stairs for the last "
        "time, he paused at every window to look out over the grey water. He smiled."
    )
    # (first_segment_chars 0, as served: no cap on the first segment's length)
    assert split_text(text, first_fragment_words=13, first_segment_chars=0) == [
        "When the old lighthouse keeper finally climbed the narrow spiral stairs for the "
        "last time,",
        "he paused at every window to look out over the grey water.",
        "He smiled.",
    ]
    # only the stream's first sentence: the second keeps its comma
    second = split_text("Hi. " + text, first_fragment_words=13, first_segment_chars=0)[1]
    assert second == text[: text.index(" He")]


def test_short_first_sentence_is_not_cut_and_zero_disables_the_cut() -> None:
    assert split_text("Yes, I do. Me too.", first_fragment_words=6) == ["Yes, I do.", "Me too."]
    text = "One two three four five six seven eight. Nine."
    assert split_text(text, first_fragment_words=0) == [
        "One two three four five six seven eight.",
        "Nine.",
    ]


def test_sentences_abbreviations_initials_and_paragraphs() -> None:
    text = "Hi there. Dr. Smith met J. R. Doe, e.g. at noon! Really?\n\nNew paragraph\nsame one"
    assert split_text(text, first_fragment_words=0) == [
        "Hi there.",
        "Dr. Smith met J. R. Doe, e.g. at noon!",
        "Really?",
        "New paragraph same one",
    ]


def test_decimal_points_and_closing_quotes() -> None:
    text = 'It costs 3.50 dollars. "Is that so?" she asked.'
    assert split_text(text, first_fragment_words=0) == [
        "It costs 3.50 dollars.",
        '"Is that so?"',
        "she asked.",
    ]


def test_whitespace_is_normalised() -> None:
    assert split_text("  Hello\t\tworld.\n  Next   one.  ") == ["Hello world.", "Next one."]
    assert split_text(" \n\t ") == []


def test_long_sentence_splits_at_clause_boundaries_within_the_limit() -> None:
    clause = "this clause has exactly some words in it"  # 40 characters
    text = ", ".join([clause] * 6) + "."
    segments = split_text(text, first_fragment_words=0, max_segment_chars=100)
    assert all(len(s) <= 100 for s in segments)
    assert len(segments) == 3
    assert all(s.endswith((",", ".")) for s in segments)


def test_long_sentence_without_clauses_splits_between_words() -> None:
    text = " ".join(f"w{i:03d}" for i in range(100))  # 499 characters
    segments = split_text(text, first_fragment_words=0, max_segment_chars=50)
    assert all(len(s) <= 50 for s in segments)
    assert " ".join(segments) == text


def test_a_word_longer_than_the_limit_is_cut_by_length() -> None:
    word = "x" * 80
    segments = split_text(f"a {word} b", first_fragment_words=0, max_segment_chars=30)
    assert segments == ["a " + "x" * 28, "x" * 30, "x" * 22 + " b"]


def test_a_long_token_is_cut_at_its_own_punctuation() -> None:
    url = "https://example.com/" + "/".join(["abcdefghij"] * 12)  # 151 characters
    segments = split_text(f"Visit {url} today.", first_fragment_words=0, max_segment_chars=50)
    assert all(len(s) <= 50 for s in segments)
    assert all(s.endswith("/") for s in segments[:-1]), segments
    assert "".join(" ".join(segments).split()) == "".join(f"Visit {url} today.".split())


def test_the_phoneme_proxy_bounds_symbols_and_other_letters() -> None:
    assert estimated_phonemes("ab, c") == 5
    assert estimated_phonemes("é1") == 3 + 4
    assert estimated_phonemes("🎉") == 12
    segments = split_text("🎉" * 100, first_fragment_words=0, max_segment_phonemes=60)
    assert [len(s) for s in segments] == [5] * 20
    segments = split_text("é" * 4096, first_fragment_words=0, max_segment_chars=300)
    assert all(len(s) <= 300 and estimated_phonemes(s) <= 400 for s in segments)
    assert "".join(segments) == "é" * 4096


def test_ideographs_and_kana_cost_what_an_english_voice_says_for_them() -> None:
    """The bundled English voice reads a CJK ideograph or a kana by its name (15-16
    phonemes each): a run of them is cut so that a talker call stays within the bound."""
    assert estimated_phonemes("漢") == estimated_phonemes("カ") == 16
    assert estimated_phonemes("한") == 3  # hangul is read as sounds
    segments = split_text("漢" * 4096, first_fragment_words=0)
    assert all(len(s) <= 400 // 16 for s in segments)
    assert "".join(segments) == "漢" * 4096


def test_the_first_segment_of_a_stream_is_short_even_for_one_long_token() -> None:
    token = "é" * 1000
    segments = split_text(f"{token} then.", first_fragment_words=6, first_segment_chars=40)
    # 40, 80, 160, 320, then 400 estimated phonemes (3 per letter)
    assert [len(s) for s in segments[:5]] == [13, 26, 53, 106, 133]
    assert all(len(s) <= 300 for s in segments)
    # no first-fragment cut (0): no first-segment cap either
    assert len(split_text(token, first_fragment_words=0)[0]) == 133  # 400 phonemes / 3


def test_the_first_fragment_leaves_no_one_or_two_word_remainder() -> None:
    # cutting after 6 words would leave "front desk." alone: a talker call for ~0.5 s
    text = "Please wait for me at the front desk. Thanks."
    assert split_text(text, first_fragment_words=6) == [
        "Please wait for me at the front desk.",
        "Thanks.",
    ]
    text = "Please wait for me at the desk, thanks."
    assert split_text(text, first_fragment_words=6) == [text]
    text = "Wait for me, at the big front desk."
    assert split_text(text, first_fragment_words=6) == ["Wait for me,", "at the big front desk."]


def test_a_long_first_sentence_in_pieces_waits_for_the_first_fragment() -> None:
    # found by the property below: a too-long sentence was split before the first
    # fragment was known, unlike the whole text
    text = "word " + "supercalifragilistic" * 3 + " word word word word "
    segmenter = Segmenter(first_fragment_words=3, max_segment_chars=20)
    pieces = segmenter.push(text[:66]) + segmenter.push(text[66:]) + segmenter.flush()
    assert pieces == split_text(text, first_fragment_words=3, max_segment_chars=20)


def test_a_leading_dash_is_not_a_first_fragment() -> None:
    text = "— And then, after a long pause, the old man finally spoke again."
    assert split_text(text, first_fragment_words=6)[0] == "— And then,"


def test_incremental_text_emits_the_first_fragment_before_the_sentence_ends() -> None:
    segmenter = Segmenter(first_fragment_words=3)
    assert segmenter.push("Hello there, my") == []  # 3 words: maybe the whole sentence
    assert segmenter.push(" dear") == []  # the cut would leave 2 words so far
    assert segmenter.push(" old") == ["Hello there,"]
    assert segmenter.push(" friend. How are") == ["my dear old friend."]
    assert segmenter.push(" you") == []
    assert segmenter.flush() == ["How are you"]


def test_incremental_boundary_needs_the_whitespace_after_it() -> None:
    segmenter = Segmenter(first_fragment_words=0)
    assert segmenter.push("It is 3.") == []
    assert segmenter.push("5 now.") == []
    assert segmenter.push(" Yes") == ["It is 3.5 now."]
    assert segmenter.flush() == ["Yes"]


_TOKENS = st.sampled_from(
    [
        "word",
        "Alpha",
        "x",
        "Dr.",
        "e.g.",
        "J.",
        "end.",
        "why?",
        "wow!",
        "pause,",
        "semi;",
        "colon:",
        "—",
        "-",
        "3.5",
        '"quoted."',
        "(aside)",
        "supercalifragilistic" * 3,
        "https://example.com/some/long-path_to?a=page&b=2#x",
        "é" * 45,
        "🎉🎉🎉",
    ]
)
_SPACES = st.sampled_from([" ", " ", " ", "  ", "\n", "\n\n", "\t"])


@st.composite
def _texts(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(_TOKENS, min_size=0, max_size=60))
    return "".join(token + draw(_SPACES) for token in tokens)


@settings(max_examples=200, deadline=None)
@given(
    text=_texts(),
    words=st.integers(0, 8),
    max_chars=st.integers(20, 120),
    max_phonemes=st.integers(20, 200),
    first_chars=st.integers(0, 60),
    data=st.data(),
)
def test_nothing_is_lost_and_pieces_match_the_whole(
    text: str, words: int, max_chars: int, max_phonemes: int, first_chars: int, data: st.DataObject
) -> None:
    bounds = {
        "first_fragment_words": words,
        "max_segment_chars": max_chars,
        "max_segment_phonemes": max_phonemes,
        "first_segment_chars": first_chars,
    }
    whole = split_text(text, **bounds)
    # cuts fall between words or inside a too-long token: every character stays, in order
    assert "".join(" ".join(whole).split()) == "".join(text.split())
    assert all(segment and segment == " ".join(segment.split()) for segment in whole)
    for segment in whole:
        assert len(segment) <= max_chars
        assert estimated_phonemes(segment) <= max_phonemes or len(segment) == 1
    if words > 0 and first_chars > 0:
        for index, segment in enumerate(whole[:8]):  # the ramp: first_chars, doubling
            ramp = first_chars << index
            assert len(segment) <= ramp
            assert estimated_phonemes(segment) <= ramp or len(segment) == 1

    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    segmenter = Segmenter(**bounds)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    incremental = [s for piece in pieces for s in segmenter.push(piece)] + segmenter.flush()
    assert incremental == whole
