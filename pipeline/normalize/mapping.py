"""Where each character of normalised text came from in the text as written.

The normaliser's rules rewrite spans of the text ("$3.50" -> "three dollars and fifty
cents", "Dr." -> "Doctor") and leave the rest as it was, white space aside. So the map
is found by comparing the two texts word by word (runs of non-space characters):
difflib's longest matching runs pair the words left unchanged (each character then
stands for its own); between two such runs, the spoken words stand for the written ones
they replaced: one for one where the counts agree (character for character where the
lengths do too), else all of them for the whole written span. A spoken word with no
written one (a rule that added a word after an unchanged one: "$5 million" -> "five
million dollars") joins the word before it: both stand for that word's span. Written
words with no spoken one (an emoji, a dash the rules dropped) are stood for by nothing.
A spoken space stands for nothing (an empty span where the text before it ends).
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

_WORD = re.compile(r"\S+")

Span = tuple[int, int]


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

    matcher = SequenceMatcher(
        None, [written[a:b] for a, b in src], [spoken[a:b] for a, b in out], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
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
