"""Where each character of normalised text came from in the text as written.

The normaliser's rules rewrite spans of the text ("$3.50" -> "three dollars and fifty
cents", "Dr." -> "Doctor") and leave the rest as it was, white space aside. So the map
is found by comparing the two texts word by word (runs of non-space characters): a walk
along both pairs the words left unchanged (each character then stands for its own); at a
difference it resumes at the nearest word pair that agrees, with the next pair agreeing
too (so a "two" said for "2" does not pair with a written "two" further on), and
difflib compares the short stretch in between. Between two unchanged words, the spoken
words stand for the written ones they replaced: one for one where the counts agree
(character for character where the lengths do too), else all of them for the whole
written span. A spoken word with no written one (a rule that added a word after an
unchanged one: "$5 million now" -> "five million dollars now") joins the word before
it: both stand for that word's span. Written words with no spoken one (an emoji, a dash
the rules dropped) are stood for by nothing. A spoken space stands for nothing (an empty
span where the text before it ends).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator
from difflib import SequenceMatcher

_WORD = re.compile(r"\S+")

Span = tuple[int, int]
Opcode = tuple[str, int, int, int, int]

_LOOKAHEAD_WORDS = 16  # written words a difference may span before the texts agree again
_TRIES = 8  # places tried per written word when looking for where the texts agree again


def _opcodes(a: list[str], b: list[str]) -> Iterator[Opcode]:
    """difflib's opcodes for word lists `a` and `b`, in about linear time (difflib's own
    matcher is quadratic or worse on long texts with repeated words)."""
    where: defaultdict[str, list[int]] = defaultdict(list)
    for position, word in enumerate(b):
        where[word].append(position)
    n, m = len(a), len(b)
    i = j = 0
    while i < n and j < m:
        if a[i] == b[j]:
            start_i, start_j = i, j
            while i < n and j < m and a[i] == b[j]:
                i, j = i + 1, j + 1
            yield ("equal", start_i, i, start_j, j)
            continue
        best: tuple[int, int, int] | None = None  # (cost, next i, next j)
        for di in range(min(_LOOKAHEAD_WORDS, n - i)):
            if best is not None and di >= best[0]:
                break
            positions = where.get(a[i + di], ())
            k = bisect_left(positions, j)
            for p in positions[k : k + _TRIES]:
                if p == j and di == 0:
                    continue
                ends = i + di + 1 == n or p + 1 == m
                if ends or a[i + di + 1] == b[p + 1]:
                    cost = di + p - j
                    if best is None or cost < best[0]:
                        best = (cost, i + di, p)
                    break
        stop_i, stop_j = (n, m) if best is None else best[1:]
        matcher = SequenceMatcher(None, a[i:stop_i], b[j:stop_j], autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            yield (tag, i + i1, i + i2, j + j1, j + j2)
        i, j = stop_i, stop_j
    if i < n or j < m:
        tag = "delete" if j == m else "insert" if i == n else "replace"
        yield (tag, i, n, j, m)


def map_spans(written: str, spoken: str) -> tuple[Span, ...]:
    """Per character of `spoken`, the span of `written` it stands for (see the module
    doc): the spans of its non-space characters in order, each starting no earlier than
    the one before; a space's span empty."""
    src = [m.span() for m in _WORD.finditer(written)]
    out = [m.span() for m in _WORD.finditer(spoken)]
    spans: list[Span | None] = [None] * len(spoken)

    def assign(token: int, span: Span) -> None:
        start, end = out[token]
        for index in range(start, end):
            spans[index] = span

    words = [written[a:b] for a, b in src]
    said = [spoken[a:b] for a, b in out]
    for tag, i1, i2, j1, j2 in _opcodes(words, said):
        if tag == "delete":
            continue
        if tag == "insert":
            # joins the spoken word before it (or, at the start, the written word after it)
            if j1 > 0:
                first = spans[out[j1 - 1][0]]
                last = spans[out[j1 - 1][1] - 1]
                assert first is not None and last is not None
                joined = (first[0], last[1])
            elif i1 < len(src):
                joined = src[i1]
            else:
                joined = (0, 0)
            for token in range(max(j1 - 1, 0), j2):
                assign(token, joined)
            continue
        if tag == "equal" or i2 - i1 == j2 - j1:
            for k in range(j2 - j1):
                (ws, we), (ss, se) = src[i1 + k], out[j1 + k]
                if we - ws == se - ss:  # character for character
                    for c in range(se - ss):
                        spans[ss + c] = (ws + c, ws + c + 1)
                else:
                    assign(j1 + k, (ws, we))
            continue
        whole = (src[i1][0], src[i2 - 1][1])
        for token in range(j1, j2):
            assign(token, whole)
    result: list[Span] = []
    cursor = 0
    for span in spans:
        if span is None:  # a space: nothing, where the text before it ends
            result.append((cursor, cursor))
        else:
            result.append(span)
            cursor = span[1]
    return tuple(result)
