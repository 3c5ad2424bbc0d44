"""Where each character of a segment is heard, from Piper's duration predictor.

The encoder gives every phoneme id its whole frames (`durations`, the frames the flow
expands it to: exact, at the segment's length scale). A phoneme's frames are those of
its ids and of the PAD after it; BOS, the first PAD and EOS belong to no phoneme.

espeak-ng separates its words by a space phoneme, but not always one to one with the
text's words: it joins short ones ("I am" -> "aɪɐm", "of the" -> "ʌvðə"), drops what it
does not read ("--") and may read one token as several words. So the text's words and
the phoneme words are matched by a small dynamic programme over their lengths (letters
against phonemes, scaled to the same total): one text word to one phoneme word, several
text words to one (their letters share its frames in proportion), one to several, a text
word with no letter to none. A word's trailing punctuation gets the frames of the
phoneme word's trailing punctuation (espeak keeps the clause's terminator: its pause);
within a word, letters share its phonemes' frames evenly. A character with nothing to
say (a space, a leading quote) gets no frames, at the time of what comes before it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.backend import SegmentTiming

_WORD = re.compile(r"\S+")
_MAX_JOINED = 4  # most words on either side of one match
_JOIN_COST = 0.75  # per word joined beyond one (in phonemes): one-to-one is preferred
_SKIP_COST = 3.0  # a word with letters matched to nothing (plus its length)
_LONE_LETTER = 2  # letters a lone letter counts as ("a", "I", "P": one or two phonemes)


@dataclass(slots=True)
class _PhonemeWord:
    start: float  # frame where its first sounding phoneme starts
    end: float  # frame where its last sounding phoneme ends
    length: int  # sounding phonemes (stress and length marks not counted)
    punct: tuple[float, float] | None  # frames of its trailing punctuation


@dataclass(slots=True)
class _TextWord:
    start: int  # character offsets in the segment text
    core_start: int  # first letter or digit
    core_end: int  # one past the last
    end: int
    letters: int


def _is_punct(phoneme: str) -> bool:
    return bool(phoneme) and unicodedata.category(phoneme[0]).startswith("P")


def _sounds(phoneme: str) -> bool:
    category = unicodedata.category(phoneme[0]) if phoneme else "Zs"
    return category[0] == "L" and category != "Lm"


def phoneme_frames(
    phonemes: Sequence[str], owners: Sequence[int], durations: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) frame of each phoneme: its ids' frames and the PAD's after it; a
    phoneme without ids starts and ends where the one before it ended."""
    frames = np.asarray(durations, dtype=np.float64).reshape(-1)
    if len(frames) != len(owners):
        raise ValueError(f"{len(frames)} durations for {len(owners)} phoneme ids")
    ends = np.cumsum(frames)
    starts = ends - frames
    first = np.full(len(phonemes), -1.0)
    last = np.full(len(phonemes), -1.0)
    for index, owner in enumerate(owners):
        if owner < 0:
            continue
        if first[owner] < 0:
            first[owner] = starts[index]
        last[owner] = ends[index]
    cursor = 0.0  # BOS and the PAD after it come before the first phoneme
    for index, owner in enumerate(owners):
        if owner >= 0:
            break
        cursor = float(ends[index])
    for index in range(len(phonemes)):
        if first[index] < 0:
            first[index] = last[index] = cursor
        cursor = last[index]
    return first, last


def _phoneme_words(
    phonemes: Sequence[str], starts: np.ndarray, ends: np.ndarray
) -> list[_PhonemeWord]:
    words: list[_PhonemeWord] = []
    current: list[int] = []

    def close() -> None:
        if not current:
            return
        body = [i for i in current if not _is_punct(phonemes[i])]
        punct = [i for i in current if _is_punct(phonemes[i])]
        if body:
            start, end = float(starts[body[0]]), float(ends[body[-1]])
        else:
            start = end = float(starts[current[0]])
        tail = (float(starts[punct[0]]), float(ends[punct[-1]])) if punct else None
        length = sum(1 for i in body if _sounds(phonemes[i]))
        words.append(_PhonemeWord(start, end, length, tail))
        current.clear()

    for index, phoneme in enumerate(phonemes):
        if phoneme.isspace():
            close()
        else:
            current.append(index)
    close()
    return words


def _text_words(text: str) -> list[_TextWord]:
    words = []
    for match in _WORD.finditer(text):
        start, end = match.span()
        alnum = [i for i in range(start, end) if text[i].isalnum()]
        if alnum:
            # a lone letter is read by its name ("P" -> "pˈiː"): a few phonemes
            letters = _LONE_LETTER if len(alnum) == 1 and text[alnum[0]].isalpha() else len(alnum)
            words.append(_TextWord(start, alnum[0], alnum[-1] + 1, end, letters))
        else:
            words.append(_TextWord(start, end, end, end, 0))
    return words


def match_words(letters: Sequence[int], lengths: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Text words (by letters) matched to phoneme words (by sounding phonemes), in order:
    (first text word, end, first phoneme word, end) per match; a side may be empty
    (a text word with nothing said, a phoneme word of punctuation only)."""
    n, m = len(letters), len(lengths)
    scale = (sum(lengths) / sum(letters)) if sum(letters) else 1.0
    need = [scale * value for value in letters]
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            here = cost[i][j]
            if here == inf:
                continue

            def relax(a: int, b: int, step: float, i: int = i, j: int = j, here: float = here):
                if i + a <= n and j + b <= m and here + step < cost[i + a][j + b]:
                    cost[i + a][j + b] = here + step
                    back[i + a][j + b] = (i, j)

            if i < n:  # a text word matched to nothing
                relax(1, 0, 0.0 if letters[i] == 0 else _SKIP_COST + need[i])
            if j < m:  # a phoneme word matched to nothing
                relax(0, 1, 0.0 if lengths[j] == 0 else _SKIP_COST + lengths[j])
            for a in range(1, _MAX_JOINED + 1):
                if i + a > n:
                    break
                wanted = sum(need[i : i + a])
                for b in range(1, _MAX_JOINED + 1) if a == 1 else (1,):
                    if j + b > m:
                        break
                    got = sum(lengths[j : j + b])
                    relax(a, b, abs(wanted - got) + _JOIN_COST * (a + b - 2))
    matches = []
    i, j = n, m
    while (i, j) != (0, 0):
        previous = back[i][j]
        assert previous is not None
        matches.append((previous[0], i, previous[1], j))
        i, j = previous
    matches.reverse()
    return matches


def segment_timing(
    text: str, phonemes: Sequence[str], owners: Sequence[int], durations: np.ndarray
) -> SegmentTiming:
    """The frames of each character of `text` (see the module doc)."""
    starts_f, ends_f = phoneme_frames(phonemes, owners, durations)
    p_words = _phoneme_words(phonemes, starts_f, ends_f)
    t_words = _text_words(text)
    start = [0.0] * len(text)
    end = [0.0] * len(text)
    timed: dict[int, tuple[float, float]] = {}

    def spread(first: int, stop: int, begin: float, finish: float) -> None:
        count = stop - first
        for k in range(count):
            timed[first + k] = (
                begin + (finish - begin) * k / count,
                begin + (finish - begin) * (k + 1) / count,
            )

    for ti, tj, pi, pj in match_words([w.letters for w in t_words], [w.length for w in p_words]):
        if ti == tj:
            continue
        words = t_words[ti:tj]
        if pi == pj:  # nothing said: every character at the time of what came before
            continue
        group = p_words[pi:pj]
        begin, finish = group[0].start, group[-1].end
        total = sum(w.letters for w in words) or 1
        at = begin
        for word in words:
            share = (finish - begin) * word.letters / total
            spread(word.core_start, word.core_end, at, at + share)
            at += share
        punct = group[-1].punct
        last = words[-1]
        if punct is not None and last.end > last.core_end:
            spread(last.core_end, last.end, *punct)
    cursor = 0.0
    for index in range(len(text)):
        begin, finish = timed.get(index, (cursor, cursor))
        begin = max(begin, cursor)
        finish = max(finish, begin)
        start[index], end[index] = begin, finish
        if index in timed:
            cursor = finish
    return SegmentTiming(tuple(start), tuple(end))
