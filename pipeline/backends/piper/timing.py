"""Where each character of a segment is heard, from Piper's duration predictor.

The encoder gives every phoneme id its whole frames (`durations`, the frames the flow
expands it to: exact, at the segment's length scale, so speed is in them). A phoneme's
frames are those of its ids and of the PAD before it; BOS, the last PAD and EOS belong to
no phoneme (phonemes.py: `phonemes_to_owned_ids`). Frame 0 is the segment's first frame:
the engine adds the frames of the stream's segments before it.

espeak-ng separates its words by a space phoneme, but not always one to one with the
text's words: it joins short ones ("I am" -> "aɪɐm", "of the" -> "ʌvðə"), drops what it
does not read ("--") and may read one token as several words. So the text's words and
the phoneme words are matched by a small dynamic programme over their lengths (letters
against phonemes, scaled to the same total): one text word to one phoneme word, several
text words to one (their letters share its frames in proportion), one to several, a text
word with no letter to none; joining costs, so a coincidence of lengths does not shift
words that espeak said one by one. The programme runs clause by clause where both sides
end the same clauses (espeak keeps , . ; : ! ? after a clause's last word), and not at
all where every word has its phoneme word of about the right length. A word's trailing
punctuation gets the frames of the phoneme word's trailing punctuation (espeak keeps the
clause's terminator: its pause); within a word, letters share its phonemes' frames
evenly. A character with nothing to
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
_BAND = 6  # phoneme words the match may stray from the diagonal
_CLAUSE_MARKS = frozenset(",.;:!?")  # espeak keeps these after a clause's last word
_JOIN_COST = 2.5  # per word joined beyond one (in phonemes): one-to-one is preferred
_SKIP_COST = 3.0  # a word with letters matched to nothing (plus its length)
_LONE_LETTER = 2  # letters a lone letter counts as ("a", "I", "P": one or two phonemes)
_DIGIT = 5  # letters a digit counts as ("7" -> "sˈɛvən"; a year's four: about 24)


@dataclass(slots=True)
class _PhonemeWord:
    start: float  # frame where its first sounding phoneme starts
    end: float  # frame where its last sounding phoneme ends
    length: int  # sounding phonemes (stress and length marks not counted)
    punct: tuple[float, float] | None  # frames of its trailing punctuation
    mark: str  # its last punctuation phoneme when it ends a clause (, . ; : ! ?), else ""


@dataclass(slots=True)
class _TextWord:
    start: int  # character offsets in the segment text
    core_start: int  # first letter or digit
    core_end: int  # one past the last
    end: int
    letters: int  # its letters and digits, weighted (a proxy for its phonemes)
    mark: str  # its last character when it ends a clause (, . ; : ! ?), else ""


def _is_punct(phoneme: str) -> bool:
    return bool(phoneme) and unicodedata.category(phoneme[0]).startswith("P")


def _sounds(phoneme: str) -> bool:
    category = unicodedata.category(phoneme[0]) if phoneme else "Zs"
    return category[0] == "L" and category != "Lm"


def phoneme_frames(
    phonemes: Sequence[str], owners: Sequence[int], durations: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) frame of each phoneme: the frames of the ids it owns (`owners`); a
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
        mark = phonemes[punct[-1]] if punct and phonemes[punct[-1]] in _CLAUSE_MARKS else ""
        words.append(_PhonemeWord(start, end, length, tail, mark))
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
        mark = text[end - 1] if text[end - 1] in _CLAUSE_MARKS else ""
        alnum = [i for i in range(start, end) if text[i].isalnum()]
        if alnum:
            # a lone letter is read by its name ("P" -> "pˈiː"): a few phonemes; a digit
            # is a word of its own (normalisation off): several
            digits = sum(1 for i in alnum if text[i].isdigit())
            letters = len(alnum) + (_DIGIT - 1) * digits
            if len(alnum) == 1 and text[alnum[0]].isalpha():
                letters = _LONE_LETTER
            words.append(_TextWord(start, alnum[0], alnum[-1] + 1, end, letters, mark))
        else:
            words.append(_TextWord(start, end, end, end, 0, mark))
    return words


def match_words(letters: Sequence[int], lengths: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Text words (by letters) matched to phoneme words (by sounding phonemes), in order:
    (first text word, end, first phoneme word, end) per match; a side may be empty
    (a text word with nothing said, a phoneme word of punctuation only).

    The programme runs in a band around the diagonal (the two sides drift apart by a
    few words at most); when the band holds no full match it runs again without one."""
    n, m = len(letters), len(lengths)
    total = sum(letters)
    scale = sum(lengths) / total if total else 1.0
    needed = [0.0]
    for value in letters:
        needed.append(needed[-1] + scale * value)
    have = [0]
    for value in lengths:
        have.append(have[-1] + value)
    if n == m and all(
        abs(needed[k + 1] - needed[k] - lengths[k]) <= max(2.0, 0.5 * lengths[k]) for k in range(n)
    ):  # the common case: one to one, every length about right
        return [(k, k + 1, k, k + 1) for k in range(n)]
    matches = _match(letters, lengths, needed, have, _BAND)
    if matches is None:
        matches = _match(letters, lengths, needed, have, n + m)
    assert matches is not None, "a match without a band always exists"
    return matches


def _match(
    letters: Sequence[int],
    lengths: Sequence[int],
    needed: list[float],
    have: list[int],
    band: int,
) -> list[tuple[int, int, int, int]] | None:
    n, m = len(letters), len(lengths)
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int]]] = [[(-1, -1)] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i in range(n + 1):
        center = i * m // n if n else 0
        row = cost[i]
        for j in range(max(0, center - band), min(m, center + band) + 1):
            here = row[j]
            if here == inf:
                continue
            if i < n:  # a text word matched to nothing
                step = 0.0 if letters[i] == 0 else _SKIP_COST + needed[i + 1] - needed[i]
                if here + step < cost[i + 1][j]:
                    cost[i + 1][j] = here + step
                    back[i + 1][j] = (i, j)
            if j < m:  # a phoneme word matched to nothing
                step = 0.0 if lengths[j] == 0 else _SKIP_COST + lengths[j]
                if here + step < row[j + 1]:
                    row[j + 1] = here + step
                    back[i][j + 1] = (i, j)
            for a in range(1, min(_MAX_JOINED, n - i) + 1):
                wanted = needed[i + a] - needed[i]
                target = cost[i + a]
                for b in range(1, min(_MAX_JOINED if a == 1 else 1, m - j) + 1):
                    step = abs(wanted - (have[j + b] - have[j])) + _JOIN_COST * (a + b - 2)
                    if here + step < target[j + b]:
                        target[j + b] = here + step
                        back[i + a][j + b] = (i, j)
    if cost[n][m] == inf:
        return None
    matches = []
    i, j = n, m
    while (i, j) != (0, 0):
        pi, pj = back[i][j]
        matches.append((pi, i, pj, j))
        i, j = pi, pj
    matches.reverse()
    return matches


def _clause_matches(
    t_words: list[_TextWord], p_words: list[_PhonemeWord]
) -> list[tuple[int, int, int, int]]:
    """`match_words` clause by clause where both sides end the same clauses with the same
    marks (espeak keeps a clause's terminator after its last word): short programmes
    that cannot stray across a clause; else over the whole segment."""
    t_cuts = [i + 1 for i, word in enumerate(t_words) if word.mark]
    p_cuts = [j + 1 for j, word in enumerate(p_words) if word.mark]
    pieces = [(0, len(t_words), 0, len(p_words))]
    if [t_words[i - 1].mark for i in t_cuts] == [p_words[j - 1].mark for j in p_cuts]:
        bounds = list(zip([0, *t_cuts], [*t_cuts, len(t_words)], strict=True))
        p_bounds = list(zip([0, *p_cuts], [*p_cuts, len(p_words)], strict=True))
        pieces = [(a, b, c, d) for (a, b), (c, d) in zip(bounds, p_bounds, strict=True)]
    matches = []
    for ti, tj, pi, pj in pieces:
        if ti == tj and pi == pj:
            continue
        for a, b, c, d in match_words(
            [w.letters for w in t_words[ti:tj]], [w.length for w in p_words[pi:pj]]
        ):
            matches.append((ti + a, ti + b, pi + c, pi + d))
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

    for ti, tj, pi, pj in _clause_matches(t_words, p_words):
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
