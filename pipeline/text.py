"""Text segmentation: what one talker call gets.

A stream's text is cut into segments, one talker call each:

- sentences (ended by . ! ? … followed by whitespace, or a blank line), except after
  common abbreviations and initials ("Dr.", "e.g.", "J.");
- the stream's first segment is short so that the first chunk comes fast: the first
  clause when it ends within `first_fragment_words` words, else the first
  `first_fragment_words` words (0 disables the cut);
- a sentence longer than `max_segment_chars` is split at clause boundaries (, ; : and
  spaced dashes), or at a word boundary when no clause boundary fits; never mid-word
  (a single word longer than the limit stays whole);
- whitespace is normalised (runs become one space, ends trimmed).

Cuts happen only at whitespace, so the words of the segments, in order, are exactly the
words of the input (`" ".join(segments).split() == text.split()`).

`Segmenter` works incrementally (live text arrives in pieces): `push` returns the
segments that are complete so far, `flush` the rest. A boundary is confirmed only once
the whitespace after it has arrived.
"""

from __future__ import annotations

import re

MIN_REST_WORDS = 3  # the first fragment is not cut off when fewer words would remain
_CLOSERS = "\"'”’»)\\]}"
_SENTENCE_END = re.compile(rf"[.!?…]+[{_CLOSERS}]*(?=\s)")
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n")
_CLAUSE_END = re.compile(rf"(?:[,;:]|[—–])[{_CLOSERS}]*(?=\s)|(?<=\s)(?:—|–|--?)(?=\s)")
_ABBREVIATIONS = frozenset(
    [
        "mr.",
        "mrs.",
        "ms.",
        "dr.",
        "prof.",
        "st.",
        "sr.",
        "jr.",
        "vs.",
        "e.g.",
        "i.e.",
        "no.",
        "fig.",
        "mt.",
        "approx.",
        "cf.",
        "inc.",
        "ltd.",
    ]
)
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+")


def normalise(text: str) -> str:
    """Whitespace runs become one space; the ends are trimmed."""
    return " ".join(text.split())


def _is_abbreviation(text: str, end: int) -> bool:
    """Whether the word ending at `end` (just after its punctuation) is an abbreviation."""
    start = end
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    word = text[start:end].rstrip(_CLOSERS.replace("\\", ""))
    return word.lower() in _ABBREVIATIONS or _INITIALS.fullmatch(word) is not None


def _sentence_end(text: str) -> tuple[int, int] | None:
    """(end of the first sentence, start of the rest) in raw `text`, if one is confirmed."""
    best: tuple[int, int] | None = None
    for match in _SENTENCE_END.finditer(text):
        if match.group().startswith(".") and _is_abbreviation(text, match.end()):
            continue
        best = (match.end(), match.end())
        break
    paragraph = _PARAGRAPH.search(text)
    if paragraph is not None and (best is None or paragraph.start() < best[0]):
        best = (paragraph.start(), paragraph.end())
    return best


def _word_cut(text: str, words: int) -> int | None:
    """Index in normalised `text` just after its `words`-th word, if more words follow."""
    position = -1
    for _ in range(words):
        position = text.find(" ", position + 1)
        if position < 0:
            return None
    return position


def _has_word(text: str) -> bool:
    return any(c.isalnum() for c in text)


def _first_fragment(text: str, max_words: int) -> int | None:
    """Where to cut the stream's first fragment off normalised `text` (its first sentence,
    or the start of it), or None when the sentence is short enough as it is, or when the
    cut would leave a remainder of a word or two (a segment that short is a talker call
    and a vocoder turn for a fraction of a second of audio)."""
    if max_words <= 0 or len(text.split()) <= max_words:
        return None
    # the first clause end with a word before it (a leading dash is no clause)
    clause = next((m for m in _CLAUSE_END.finditer(text) if _has_word(text[: m.start()])), None)
    if clause is not None and len(text[: clause.end()].split()) <= max_words:
        cut = clause.end()
    else:
        cut = _word_cut(text, max_words)
    if cut is None or len(text[cut:].split()) < MIN_REST_WORDS:
        return None
    return cut


def split_long(text: str, max_chars: int) -> list[str]:
    """Split normalised `text` into pieces of at most `max_chars` where possible."""
    pieces: list[str] = []
    rest = text
    while len(rest) > max_chars:
        cut = 0
        for match in _CLAUSE_END.finditer(rest, 0, max_chars + 1):
            if match.end() <= max_chars:
                cut = match.end()
        if cut < max_chars // 3:
            # no clause boundary worth cutting at: the last word boundary that fits
            word_cut = rest.rfind(" ", 0, max_chars + 1)
            if word_cut > cut:
                cut = word_cut
        if cut <= 0:
            # one word longer than the limit: keep it whole
            cut = rest.find(" ", max_chars)
            if cut < 0:
                break
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    if rest:
        pieces.append(rest)
    return pieces


class Segmenter:
    """Turns text, given whole or in pieces, into talker segments (see the module doc)."""

    def __init__(self, *, first_fragment_words: int = 6, max_segment_chars: int = 300) -> None:
        self._first_fragment_words = first_fragment_words
        self._max_segment_chars = max_segment_chars
        self._buffer = ""  # raw text not yet emitted
        self._emitted_any = False

    def push(self, text: str) -> list[str]:
        """Add text; return the segments now complete."""
        self._buffer += text
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """No more text: return every remaining segment."""
        segments = self._drain(final=True)
        self._buffer = ""
        return segments

    def _drain(self, *, final: bool) -> list[str]:
        out: list[str] = []
        while True:
            bounds = _sentence_end(self._buffer)
            if bounds is None:
                break
            sentence, self._buffer = self._buffer[: bounds[0]], self._buffer[bounds[1] :]
            out.extend(self._emit(normalise(sentence)))
        if final:
            out.extend(self._emit(normalise(self._buffer)))
            self._buffer = ""
        else:
            out.extend(self._emit_pending())
        return out

    def _emit(self, sentence: str) -> list[str]:
        """Segments of one complete (normalised) sentence."""
        if not sentence:
            return []
        out: list[str] = []
        if not self._emitted_any:
            cut = _first_fragment(sentence, self._first_fragment_words)
            if cut is not None:
                out.extend(split_long(sentence[:cut].strip(), self._max_segment_chars))
                sentence = sentence[cut:].strip()
        out.extend(split_long(sentence, self._max_segment_chars))
        self._emitted_any = self._emitted_any or bool(out)
        return out

    def _emit_pending(self) -> list[str]:
        """Segments that can leave before the current sentence ends: the first fragment,
        and the leading pieces of a sentence already too long."""
        # Only text up to the last whitespace is settled: the last word may still grow.
        stripped = self._buffer.lstrip()
        settled_end = max((i for i, c in enumerate(stripped) if c.isspace()), default=-1)
        if settled_end < 0:
            return []
        settled, tail = stripped[:settled_end], stripped[settled_end:]
        text = normalise(settled)
        out: list[str] = []
        if not self._emitted_any:
            # cut once the sentence so far (its last word maybe still growing) has more
            # than first_fragment_words words: the cut is then the one the whole
            # sentence would get
            probe = normalise(stripped)
            cut = _first_fragment(probe, self._first_fragment_words)
            if cut is not None and cut <= len(text):
                out.extend(split_long(text[:cut].strip(), self._max_segment_chars))
                self._emitted_any = True
                text = text[cut:].strip()
            elif self._first_fragment_words > 0:
                # whether the first fragment is cut off is not known until more words
                # (or the sentence end) arrive: splitting a long sentence now would cut
                # it differently from the whole text
                return []
        if len(text) > self._max_segment_chars:
            pieces = split_long(text, self._max_segment_chars)
            out.extend(pieces[:-1])
            text = pieces[-1]
            self._emitted_any = True
        if out:
            self._buffer = text + tail
        return out


def split_text(
    text: str, *, first_fragment_words: int = 6, max_segment_chars: int = 300
) -> list[str]:
    """The segments of a whole text."""
    segmenter = Segmenter(
        first_fragment_words=first_fragment_words, max_segment_chars=max_segment_chars
    )
    return segmenter.push(text) + segmenter.flush()
