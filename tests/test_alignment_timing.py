"""Piper's segment timing, frame-exact, on given durations (no model run): phonemes get
their ids' frames, words of the text get their phoneme words' frames."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.backends.piper.phonemes import phonemes_to_owned_ids
from pipeline.backends.piper.timing import match_words, phoneme_frames, segment_timing
from pipeline.backends.piper.voices import bundled_model_path, load_voice_spec


@pytest.fixture(scope="module")
def spec():
    return load_voice_spec(bundled_model_path())


def test_each_phoneme_owns_its_ids_and_the_pad_before_it(spec) -> None:
    phonemes = list("hi")
    ids, owners = phonemes_to_owned_ids(spec, phonemes)
    # BOS PAD h PAD i PAD EOS
    assert len(ids) == 7
    assert owners == [-1, 0, 0, 1, 1, -1, -1]
    durations = np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.float32)
    starts, ends = phoneme_frames(phonemes, owners, durations)
    assert starts.tolist() == [1.0, 6.0]  # after BOS; h's PAD starts at frame 1
    assert ends.tolist() == [6.0, 15.0]


def test_words_get_the_frames_of_their_phoneme_words(spec) -> None:
    text = "Hi, you there."
    phonemes = list("haɪ, juː ðɛɹ.")
    ids, owners = phonemes_to_owned_ids(spec, phonemes)
    durations = np.full(len(ids), 2.0, dtype=np.float32)  # every id two frames
    timing = segment_timing(text, phonemes, owners, durations)
    starts, ends = phoneme_frames(phonemes, owners, durations)
    assert len(timing.start_frames) == len(text)
    # "Hi" is h a ɪ (phonemes 0-2), its comma the "," phoneme (3)
    assert timing.start_frames[0] == starts[0]
    assert timing.end_frames[1] == ends[2]
    assert (timing.start_frames[2], timing.end_frames[2]) == (starts[3], ends[3])
    # "you" starts with j (phoneme 5), "there." ends with its "." (phoneme 12)
    assert timing.start_frames[4] == starts[5]
    assert timing.start_frames[8] == starts[9]
    assert timing.end_frames[-1] == ends[12]
    # a space has no frames of its own: it sits where the word before it ended
    assert timing.start_frames[3] == timing.end_frames[3] == ends[3]
    assert list(timing.start_frames) == sorted(timing.start_frames)


def test_joined_and_silent_words_are_matched() -> None:
    # "I am going -- home": espeak joins "I am" and says nothing for "--"
    assert match_words([2, 2, 5, 0, 4], [4, 5, 3]) == [
        (0, 2, 0, 1),
        (2, 3, 1, 2),
        (3, 4, 2, 2),
        (4, 5, 2, 3),
    ]
    # one word read as several ("In 1995 we" with normalisation off: a digit weighs 4)
    assert match_words([2, 20, 2], [2, 7, 10, 2]) == [(0, 1, 0, 1), (1, 2, 1, 3), (2, 3, 3, 4)]


def test_a_number_read_as_several_words_gets_them_all(spec) -> None:
    from pipeline.backends.piper.phonemes import phonemize

    text = "In 1995 we won."
    phonemes = phonemize(spec, text)
    # espeak reads it "nineteen-hundred ninety five": three phoneme words
    assert "".join(phonemes).count(" ") == 5
    ids, owners = phonemes_to_owned_ids(spec, phonemes)
    durations = np.full(len(ids), 2.0, dtype=np.float32)
    timing = segment_timing(text, phonemes, owners, durations)
    starts, ends = phoneme_frames(phonemes, owners, durations)
    spaces = [i for i, p in enumerate(phonemes) if p == " "]
    assert timing.start_frames[3] == starts[spaces[0] + 1]  # "1995" starts "nineteen"
    assert timing.end_frames[6] == ends[spaces[3] - 1]  # ... and ends "five"
    assert timing.start_frames[8] == starts[spaces[3] + 1]  # "we"


def test_joined_words_share_their_phoneme_word_by_letters(spec) -> None:
    text = "I am here"
    phonemes = list("aɪɐm hɪɹ")
    ids, owners = phonemes_to_owned_ids(spec, phonemes)
    durations = np.full(len(ids), 3.0, dtype=np.float32)
    timing = segment_timing(text, phonemes, owners, durations)
    starts, ends = phoneme_frames(phonemes, owners, durations)
    assert timing.start_frames[0] == starts[0]  # "I" starts the joined word
    assert timing.end_frames[3] == ends[3]  # "am" ends it
    assert starts[0] < timing.start_frames[2] < ends[3]  # "am" starts inside it
    assert timing.start_frames[5] == starts[5]  # "here"


@pytest.mark.parametrize(
    "text",
    [
        "We met at three thirty P M on January fifth, twenty twenty-four.",
        "Seven green apples fell from tall trees, Tuesday.",
    ],
)
def test_words_said_one_by_one_keep_their_own_phoneme_words(spec, text: str) -> None:
    """Where espeak says each word on its own, each starts its own phoneme word (a
    word-length coincidence does not shift a match: "thirty P M on" stays one to one)."""
    from pipeline.backends.piper.phonemes import phonemize

    phonemes = phonemize(spec, text)
    ids, owners = phonemes_to_owned_ids(spec, phonemes)
    durations = np.arange(len(ids), dtype=np.float32) % 3 + 1
    timing = segment_timing(text, phonemes, owners, durations)
    starts, _ = phoneme_frames(phonemes, owners, durations)
    word_starts = [0] + [i + 1 for i, p in enumerate(phonemes) if p == " "]
    assert len(word_starts) == len(text.split()), "espeak joined words: not this test's case"
    text_starts = [0] + [i + 1 for i, c in enumerate(text) if c == " "]
    assert [timing.start_frames[i] for i in text_starts] == [starts[i] for i in word_starts]
