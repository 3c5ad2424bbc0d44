"""A job's text cut into segments, its chapters found, its Markdown made speakable.

A segment is the unit a job renders and makes durable: whole sentences up to about
`segment_chars` characters (a longer sentence is cut at a space). A chapter starts at a
Markdown heading (`# Title` .. `###### Title`) or at a title line (one short line between
blank lines, with no sentence punctuation at its end); its heading is a segment of its own,
so its start time in the audio is that segment's. Offsets are into the text as sent: the
spoken form of a segment (`spoken_form`) has the same length, Markdown's markup characters
turned into spaces, so word timestamps index the text the client sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADING = re.compile(r"^[ \t]{0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$")
_TITLE_MAX_CHARS = 80
_TITLE_END = ".,;:!?\"')]»”’"
# a sentence ends at . ! ? (with closing quotes or brackets) before white space, or at a
# blank line
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]»]*(?=\s)|\n[ \t]*\n")
# Markdown markup that is not spoken: emphasis and code marks, a link's brackets and
# target, a list's bullet, a quote's marker, a rule, an image's bang
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
_MARKUP = re.compile(
    r"[*_`~]+|^[ \t]*(?:[-+>]|\d+[.)])(?=[ \t])|^[ \t]*(?:[-*_][ \t]*){3,}$|!?\[", re.M
)


@dataclass(frozen=True, slots=True)
class Segment:
    start: int  # offset of its first character in the job's text
    end: int  # one past its last
    chapter: str | None = None  # the chapter this segment's heading starts, if it is one


@dataclass(frozen=True, slots=True)
class Chapter:
    title: str
    segment: int  # the index of the segment it starts with


def spoken_form(text: str) -> str:
    """`text` with Markdown's markup characters turned into spaces (the same length)."""

    def blank(match: re.Match[str]) -> str:
        return " " * len(match.group(0))

    text = _LINK_TARGET.sub(lambda m: " " + " " * (len(m.group(0)) - 1), text)
    text = _MARKUP.sub(blank, text)
    return re.sub(
        r"^([ \t]{0,3})(#{1,6})(?=[ \t])",
        lambda m: m.group(1) + " " * len(m.group(2)),
        text,
        flags=re.M,
    )


def _heading_lines(text: str) -> list[tuple[int, int, str]]:
    """(start, end, title) of every heading or title line, in order."""
    found = []
    lines = text.split("\n")
    offset = 0
    for index, line in enumerate(lines):
        start, end = offset, offset + len(line)
        offset = end + 1
        stripped = line.strip()
        if not stripped:
            continue
        match = _HEADING.match(line)
        if match:
            found.append((start, end, match.group(2).strip()))
            continue
        before_blank = index == 0 or not lines[index - 1].strip()
        after_blank = index + 1 < len(lines) and not lines[index + 1].strip()
        if (
            before_blank
            and after_blank
            and len(stripped) <= _TITLE_MAX_CHARS
            and stripped[-1] not in _TITLE_END
            and not _SENTENCE_END.search(stripped + " ")
            and any(ch.isalnum() for ch in stripped)
        ):
            found.append((start, end, stripped))
    return found


def _cut(text: str, start: int, end: int, max_chars: int) -> list[Segment]:
    """[start, end) cut into segments of whole sentences of about `max_chars` at most."""
    segments: list[Segment] = []
    piece_start = start
    last_end = None  # the last sentence end inside the current piece
    for match in _SENTENCE_END.finditer(text, start, end):
        cut = match.end()
        if cut - piece_start > max_chars and last_end is not None:
            segments.append(Segment(piece_start, last_end))
            piece_start = last_end
        while cut - piece_start > max_chars:  # one sentence longer than a segment
            space = text.rfind(" ", piece_start + 1, piece_start + max_chars)
            split = space if space > piece_start else piece_start + max_chars
            segments.append(Segment(piece_start, split))
            piece_start = split
        last_end = cut
    while end - piece_start > max_chars:
        if last_end is not None and piece_start < last_end < end:
            segments.append(Segment(piece_start, last_end))
            piece_start = last_end
            last_end = None
            continue
        space = text.rfind(" ", piece_start + 1, piece_start + max_chars)
        split = space if space > piece_start else piece_start + max_chars
        segments.append(Segment(piece_start, split))
        piece_start = split
    if piece_start < end:
        segments.append(Segment(piece_start, end))
    return [s for s in segments if text[s.start : s.end].strip()]


def cut_segments(text: str, max_chars: int) -> list[Segment]:
    """The job's segments, in order, covering every character that is not white space
    exactly once (white space between segments belongs to none)."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    segments: list[Segment] = []
    position = 0
    for start, end, title in _heading_lines(text):
        segments += _cut(text, position, start, max_chars)
        segments.append(Segment(start, end, title))
        position = end
    segments += _cut(text, position, len(text), max_chars)
    return segments


def chapters(segments: list[Segment]) -> list[Chapter]:
    return [Chapter(s.chapter, i) for i, s in enumerate(segments) if s.chapter is not None]
