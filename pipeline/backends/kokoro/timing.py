"""Where each character of a segment is heard, from Kokoro's predicted durations.

The talker's duration output gives each token (pad, phonemes..., pad) its whole frames;
a word's frames run from its first token's start to its last token's end
(japanese.WordSpan says which phonemes are the word's). Each character of a word gets an
equal share of the word's frames; a character in no word (a space, a symbol the reading
drops) sits at the end of the word before it, with no length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.backend import SegmentTiming
from pipeline.backends.kokoro.japanese import WordSpan


def token_starts(durations: np.ndarray) -> np.ndarray:
    """Start frame of each token and, last, the total: [tokens + 1]."""
    return np.concatenate([[0.0], np.cumsum(np.asarray(durations, dtype=np.float64))])


def segment_timing(
    text_chars: int,
    words: Sequence[WordSpan],
    phoneme_frames: dict[int, tuple[float, float]],
) -> SegmentTiming | None:
    """`phoneme_frames`: phoneme index -> (start, end) frame in the segment. None when no
    word has a heard phoneme (the engine then spreads the characters evenly)."""
    starts = [0.0] * text_chars
    ends = [0.0] * text_chars
    spans: dict[tuple[int, int], list[float]] = {}
    for word in words:
        heard = [
            phoneme_frames[p]
            for p in range(word.phoneme_start, word.phoneme_stop)
            if p in phoneme_frames
        ]
        if not heard or word.text_stop > text_chars:
            continue
        begin, finish = min(s for s, _ in heard), max(e for _, e in heard)
        key = (word.text_start, word.text_stop)
        if key in spans:  # nodes sharing characters (2026: 二 千 二十六) share them
            spans[key] = [min(spans[key][0], begin), max(spans[key][1], finish)]
        else:
            spans[key] = [begin, finish]
    if not spans:
        return None
    position = 0.0
    cursor = 0
    for (first, stop), (begin, finish) in sorted(spans.items()):
        if first < cursor:
            continue  # overlaps a word placed already
        begin = max(begin, position)
        finish = max(finish, begin)
        for index in range(cursor, first):
            starts[index] = ends[index] = position
        share = (finish - begin) / (stop - first)
        for offset, index in enumerate(range(first, stop)):
            starts[index] = begin + offset * share
            ends[index] = begin + (offset + 1) * share
        position = finish
        cursor = stop
    for index in range(cursor, text_chars):
        starts[index] = ends[index] = position
    return SegmentTiming(tuple(starts), tuple(ends))
