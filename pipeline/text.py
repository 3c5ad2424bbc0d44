"""Text segmentation: what one talker call gets.

A stream's text is cut into segments, one talker call each:

- sentences (ended by . ! ? … followed by whitespace, or a blank line), except after
  common abbreviations and initials ("Dr.", "e.g.", "J."); in Japanese (and Chinese)
  text, also by 。！？ (and a closing bracket after them) with no space after, and by a
  line end after such a character (confirmed once the next character has arrived);
- with `first_fragment_words` > 0, a stream's first sentence longer than that is cut at
  its first clause end (, ; : or a dash), wherever it falls, so that the first chunk
  comes sooner (the Piper talker encodes a whole segment before its first frames); never
  between two words without a natural pause (0, this class's default, never cuts);
- a sentence longer than `max_segment_chars` characters or `max_segment_phonemes`
  estimated phonemes (`estimated_phonemes`) is split at clause boundaries (, ; : and
  spaced dashes), else at a word boundary; a single token longer than that (a URL, a run
  of one letter) is cut at its own punctuation (/ . - ? ...), else by length;
- with a first fragment (`first_fragment_words` > 0) the bounds ramp up: the stream's
  first segment gets `first_segment_chars` (characters and estimated phonemes), each next
  one twice the one before, up to the maxima. A talker call then costs about what the
  segments before it play for, even for text that plays far longer per character than
  prose (a spelled-out link);
- whitespace is normalised (runs become one space, ends trimmed).

Cuts happen at whitespace, or inside a token longer than the bounds, so the characters of
the segments, in order, are exactly those of the input, whitespace aside.

`Segmenter` works incrementally (live text arrives in pieces): `push` returns the
segments that are complete so far, `flush` the rest. A boundary is confirmed only once
the whitespace after it has arrived.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import TextConfig

MIN_REST_WORDS = 3  # the first fragment is not cut off when fewer words would remain
_CLOSERS = "\"'”’»)\\]}"
_CJK_CLOSERS = "」』）〕】〉》"
_CJK_CHARS = "\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff01-\uff9f"
_SENTENCE_END = re.compile(
    rf"[.!?…]+[{_CLOSERS}]*(?=\s)|[。！？]+[{_CLOSERS}{_CJK_CLOSERS}]*(?=[\s\S])"
    rf"|(?<=[{_CJK_CHARS}])[^\S\n]*\n"
)
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n")
_CLAUSE_END = re.compile(
    rf"(?:[,;:]|[—–])[{_CLOSERS}]*(?=\s)|(?<=\s)(?:—|–|--?)(?=\s)|[、，；：]+[{_CJK_CLOSERS}]*"
)
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


def _has_word(text: str) -> bool:
    return any(c.isalnum() for c in text)


def _words(text: str) -> int:
    """Words of `text`: the space-separated ones, and in text written without spaces
    (Japanese, Chinese) one per two ideographs or kana (a Japanese word's mean length)."""
    return len(text.split()) + len(_IDEOGRAPHS.findall(text)) // 2


def _first_fragment(text: str, max_words: int) -> int | None:
    """Where to cut the stream's first fragment off normalised `text` (its first
    sentence): at its first clause end (a natural pause: , ; : or a dash), wherever it
    falls, when the sentence has more than `max_words` words. The talker's first step
    encodes the whole first segment before any audio, so a shorter first segment is
    earlier audio, and the machine's other core gets vocoder work sooner. None when the
    sentence is short enough as it is, when it has no clause end (a sentence is never cut
    between two words that the voice would join), or when the cut would leave a remainder
    of a word or two (a segment that short is a talker call and a vocoder turn for a
    fraction of a second of audio)."""
    if max_words <= 0 or _words(text) <= max_words:
        return None
    # the first clause end with a word before it (a leading dash is no clause)
    clause = next((m for m in _CLAUSE_END.finditer(text) if _has_word(text[: m.start()])), None)
    if clause is None:
        return None
    cut = clause.end()
    if _words(text[cut:]) < MIN_REST_WORDS:
        return None
    return cut


# Estimated phonemes per character, the proxy for a segment's phoneme count (the
# phonemiser runs in the talker's thread, so the segmenter cannot count them): ASCII
# letters, spaces and punctuation about one each; a digit several (it is read as a
# word); other letters (accented, other scripts) a few; a symbol or an emoji a dozen
# (read by its name when the normaliser is off).
_PHONEMES_DIGIT = 4
_PHONEMES_OTHER_LETTER = 3
_PHONEMES_SYMBOL = 12
# A CJK ideograph or a kana: an English voice's espeak-ng reads each by a name ("Chinese
# letter", "Japanese letter"): 15-16 phonemes measured on the bundled voice (3 assumed
# before: a 300-character segment of them was 1,649 phonemes, a talker call 4x too long).
_PHONEMES_IDEOGRAPH = 16
# A voice that READS them (Japanese: Kokoro's readings take 2 to 4 phonemes a character)
# says each in ~4: its segments' phoneme bound is raised by _PHONEMES_IDEOGRAPH / 4, so
# a Japanese segment holds ~100 characters under the 400 of an English one's phonemes
_IDEOGRAPH_READERS = {"ja": 4}
_IDEOGRAPHS = re.compile(
    "[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)
# Where a long token (a URL, a path, a run of one letter) is cut when no space fits.
_TOKEN_CUT_AFTER = frozenset("/.-_?&=#:,;@+~|、，。")


def _char_phonemes(char: str) -> int:
    if char.isascii():
        return _PHONEMES_DIGIT if char.isdigit() else 1
    if char.isalnum():
        return _PHONEMES_IDEOGRAPH if _IDEOGRAPHS.match(char) else _PHONEMES_OTHER_LETTER
    return 1 if char.isspace() or unicodedata.category(char)[0] in "PZM" else _PHONEMES_SYMBOL


_DROP_DIGITS = str.maketrans("", "", "0123456789")


def estimated_phonemes(text: str) -> int:
    """The phoneme-count proxy of `text` (see _char_phonemes)."""
    if text.isascii():  # the common case, counted in C: one each, a digit four
        digits = len(text) - len(text.translate(_DROP_DIGITS))
        return len(text) + (_PHONEMES_DIGIT - 1) * digits
    return sum(_char_phonemes(char) for char in text)


def _fitting_prefix(text: str, max_chars: int, max_phonemes: int) -> int:
    """Length of the longest prefix of `text` within both bounds (at least 1 character)."""
    window = text[:max_chars]
    if estimated_phonemes(window) <= max_phonemes:  # the common case: all of it fits
        return len(window)
    total = 0
    for index, char in enumerate(text[:max_chars]):
        total += _char_phonemes(char)
        if total > max_phonemes:
            return max(index, 1)
    return min(len(text), max_chars)


def _cut(text: str, max_chars: int, max_phonemes: int) -> int | None:
    """Where to cut the first piece off normalised `text`, or None when it fits whole.

    The last clause boundary that fits; else, when none fits in the last two thirds of
    the room, the last word boundary; else (one token longer than the room) the token's
    last punctuation in the last two thirds of the room, or failing that the room's end.
    """
    room = _fitting_prefix(text, max_chars, max_phonemes)
    if room >= len(text):
        return None
    least = max(room // 3, 1)  # a cut nearer the start wastes the room
    cut = 0
    for match in _CLAUSE_END.finditer(text, 0, room + 1):
        if match.end() <= room:
            cut = match.end()
    if cut < least:
        cut = max(cut, text.rfind(" ", 0, room + 1))
    if cut < least:
        # one token longer than the room: cut it at its own punctuation, else by length
        cut = room
        for index in range(room - 1, room // 3, -1):
            if text[index] in _TOKEN_CUT_AFTER:
                cut = index + 1
                break
    return cut


def split_long(text: str, max_chars: int, max_phonemes: int | None = None) -> list[str]:
    """Split normalised `text` into pieces of at most `max_chars` characters and
    `max_phonemes` estimated phonemes (None: no phoneme bound)."""
    max_phonemes = max_phonemes if max_phonemes is not None else _PHONEMES_SYMBOL * max_chars
    pieces: list[str] = []
    rest = text
    while (cut := _cut(rest, max_chars, max_phonemes)) is not None:
        piece = rest[:cut].strip()
        if piece:
            pieces.append(piece)
        rest = rest[cut:].strip()
    if rest:
        pieces.append(rest)
    return pieces


class Segmenter:
    """Turns text, given whole or in pieces, into talker segments (see the module doc)."""

    def __init__(
        self,
        *,
        first_fragment_words: int = 0,
        max_segment_chars: int = 300,
        max_segment_phonemes: int = 400,
        first_segment_chars: int = 80,
        language: str = "",
    ) -> None:
        """`language`: the voice's ("ja", "en-US"); a voice that reads ideographs
        (_IDEOGRAPH_READERS) gets a phoneme bound as many times larger as its reading of
        one is shorter than the estimate's."""
        reads = _IDEOGRAPH_READERS.get(language.split("-")[0].lower())
        # estimated phonemes per phoneme the voice reads (the ramp's phoneme bound too)
        self._phoneme_scale = _PHONEMES_IDEOGRAPH // reads if reads else 1
        max_segment_phonemes = max_segment_phonemes * self._phoneme_scale
        self._first_fragment_words = first_fragment_words
        self._max_segment_chars = max_segment_chars
        self._max_segment_phonemes = max_segment_phonemes
        # the stream's first segment, whatever it is, is at most this long (0: no cap)
        self._first_segment_chars = first_segment_chars or max_segment_chars
        self._buffer = ""  # raw text not yet emitted
        self._emitted = 0  # segments emitted so far (the ramp's position)

    def push(self, text: str) -> list[str]:
        """Add text; return the segments now complete."""
        self._buffer += text
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """No more text: return every remaining segment."""
        segments = self._drain(final=True)
        self._buffer = ""
        return segments

    def _bounds(self, index: int) -> tuple[int, int]:
        """(chars, estimated phonemes) allowed to the stream's segment number `index`: a
        ramp from `first_segment_chars`, doubling, up to the configured maxima. Each
        segment's talker call then costs about what the segments before it play for, even
        in text that is one long token (a spelled-out URL plays far longer per character
        than prose)."""
        if self._first_fragment_words <= 0 or index >= 16:
            return self._max_segment_chars, self._max_segment_phonemes
        ramp = self._first_segment_chars << index
        phonemes = min(ramp * self._phoneme_scale, self._max_segment_phonemes)
        return min(ramp, self._max_segment_chars), phonemes

    def _split(self, text: str) -> list[str]:
        """`text` in bounded pieces, each within the bounds of its place in the stream."""
        pieces: list[str] = []
        while text:
            cut = _cut(text, *self._bounds(self._emitted))
            piece, text = (text, "") if cut is None else (text[:cut].strip(), text[cut:].strip())
            if piece:
                pieces.append(piece)
                self._emitted += 1
        return pieces

    def _too_long(self, text: str) -> bool:
        return _cut(text, *self._bounds(self._emitted)) is not None

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
        if self._emitted == 0:
            cut = _first_fragment(sentence, self._first_fragment_words)
            if cut is not None:
                out.extend(self._split(sentence[:cut].strip()))
                sentence = sentence[cut:].strip()
        out.extend(self._split(sentence))
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
        if self._emitted == 0:
            # cut once the sentence so far (its last word maybe still growing) has more
            # than first_fragment_words words: the cut is then the one the whole
            # sentence would get
            probe = normalise(stripped)
            cut = _first_fragment(probe, self._first_fragment_words)
            if cut is not None and cut <= len(text):
                out.extend(self._split(text[:cut].strip()))
                text = text[cut:].strip()
            elif self._first_fragment_words > 0:
                # whether the first fragment is cut off is not known until more words
                # (or the sentence end) arrive: splitting a long sentence now would cut
                # it differently from the whole text
                return []
        if self._too_long(text):
            pieces = self._split(text)
            out.extend(pieces[:-1])
            text = pieces[-1]
            self._emitted -= 1  # the last piece stays: it may grow
        if out:
            self._buffer = text + tail
        return out


def segment_options(config: TextConfig) -> dict[str, int]:
    """The Segmenter's keyword arguments from the `text` section."""
    return {
        "first_fragment_words": config.first_fragment_words,
        "max_segment_chars": config.max_segment_chars,
        "max_segment_phonemes": config.max_segment_phonemes,
        "first_segment_chars": config.first_segment_chars,
    }


def split_text(
    text: str,
    *,
    first_fragment_words: int = 0,
    max_segment_chars: int = 300,
    max_segment_phonemes: int = 400,
    first_segment_chars: int = 80,
) -> list[str]:
    """The segments of a whole text."""
    segmenter = Segmenter(
        first_fragment_words=first_fragment_words,
        max_segment_chars=max_segment_chars,
        max_segment_phonemes=max_segment_phonemes,
        first_segment_chars=first_segment_chars,
    )
    return segmenter.push(text) + segmenter.flush()
