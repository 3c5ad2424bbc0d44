"""When each character and word of a stream's text is heard, in the audio's own clock.

A stream's text is everything its client sent, concatenated in order (one `submit`, or a
`submit` plus every `append_text`), exactly as sent: indices are offsets into that string,
not into the normalised text the voice spoke. Times are seconds from the start of the
stream's audio (sample 0 of its first chunk), so a client converts them to samples with
the stream's sample rate, whatever the wall clock did.

The engine appends timings as the talker makes a segment's frames (before any of that
audio is sent), in order of time; the app reads them with a cursor per consumer:

    cursor = 0
    async for pcm in stream.chunks():
        sent_s += len(pcm) / stream.sample_rate_hz
        chars, cursor = stream.alignment.chars_before(sent_s, cursor)
        ...  # send chars, then pcm
    chars, cursor = stream.alignment.chars_before(math.inf, cursor)  # the rest (a final
    # space may start at the very end of the audio)

Every character is timed once the stream's audio has ended (its last chunk read). A word
is appended once complete (its last character timed and the next known to be white space,
or the text ended), so `words_before` may give a word a chunk after its first character.
Where the times come from: pipeline/aligner.py (the engine's side) and the backend's
`TalkStep.timing` (Piper: its duration predictor; others: an even spread, an estimate).

A character the voice does not speak on its own (a space, punctuation) gets the time of
the phonemes around it, with zero duration where it has none; a span of text the
normaliser expanded ("$3.50" -> "three dollars fifty") shares the time of everything it
was expanded to, spread over its characters.

Text reaches the engine as the voice will read it (normalised), so a caller that
normalises says where each spoken character came from: it passes a `SpokenText` (a str,
so every other use of it is unchanged) whose `source` is the client's text it was made
from and whose `spans` give, per spoken character, the span of `source` it stands for
(pipeline/normalize: `normalize_mapped`, `StreamNormalizer`). The stream's text is then
the concatenation of the sources; a plain str is its own source, character by character.
Every character of the stream's text gets exactly one CharTiming, in order.

`Alignment.spoken` times the spoken text the same way: the concatenation of the engine's
texts (the SpokenText strings themselves, "It costs five dollars."), each of its characters
once, in order, `index` an offset into that text (what ElevenLabs calls the normalised
alignment). Its times never decrease; `spoken_before` reads it with a cursor of its own.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass


class SpokenText(str):
    """Text for the voice, made from `source` (a piece of the client's text, as sent):
    spoken character i stands for `source[spans[i][0]:spans[i][1]]`. Spans may repeat
    (three dollars fifty all stand for "$3.50") and may be empty (a space: it stands for
    nothing). The spans of the characters that are not white space are in order (each
    starts no earlier than the one before)."""

    source: str
    spans: tuple[tuple[int, int], ...]

    def __new__(cls, text: str, source: str, spans: tuple[tuple[int, int], ...]) -> SpokenText:
        if len(spans) != len(text):
            raise ValueError(f"{len(spans)} spans for {len(text)} spoken characters")
        self = super().__new__(cls, text)
        self.source = source
        self.spans = spans
        return self

    @classmethod
    def verbatim(cls, text: str) -> SpokenText:
        """Text spoken as written: each character stands for itself."""
        return cls(text, text, tuple((i, i + 1) for i in range(len(text))))

    def __reduce__(self) -> tuple[object, ...]:
        return (SpokenText, (str(self), self.source, self.spans))

    def __add__(self, other: str) -> SpokenText:  # type: ignore[override]
        """Joined text keeps its map: `other`'s source follows this one's (a plain str
        stands for itself)."""
        if not isinstance(other, SpokenText):
            other = SpokenText.verbatim(str(other))
        shift = len(self.source)
        spans = self.spans + tuple((a + shift, b + shift) for a, b in other.spans)
        return SpokenText(str(self) + str(other), self.source + other.source, spans)


@dataclass(frozen=True, slots=True)
class CharTiming:
    """One character of the stream's text as sent (or of its spoken text: `spoken`)."""

    index: int  # offset into the stream's text (the spoken text's, in `spoken`)
    char: str
    start_s: float  # from the start of the stream's audio
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class WordTiming:
    """One word (a run of characters between white space) of the stream's text as sent."""

    word: str
    start_index: int  # offset of its first character in the stream's text
    end_index: int  # one past its last character
    start_s: float
    end_s: float


class Alignment:
    """A stream's timings, appended in time order by the engine; see the module doc."""

    __slots__ = ("_char_starts", "_spoken_starts", "_word_starts", "chars", "spoken", "words")

    def __init__(self) -> None:
        self.chars: list[CharTiming] = []
        self.words: list[WordTiming] = []
        self.spoken: list[CharTiming] = []  # the spoken (normalised) text's characters
        self._char_starts: list[float] = []
        self._word_starts: list[float] = []
        self._spoken_starts: list[float] = []

    def extend(
        self,
        chars: list[CharTiming],
        words: list[WordTiming],
        spoken: list[CharTiming] | None = None,
    ) -> None:
        """The next timings, each starting no earlier than the ones before it (per list)."""
        if chars:
            if self._char_starts and chars[0].start_s < self._char_starts[-1]:
                raise ValueError("character timings must come in time order")
            self.chars.extend(chars)
            self._char_starts.extend(c.start_s for c in chars)
        if words:
            if self._word_starts and words[0].start_s < self._word_starts[-1]:
                raise ValueError("word timings must come in time order")
            self.words.extend(words)
            self._word_starts.extend(w.start_s for w in words)
        if spoken:
            if self._spoken_starts and spoken[0].start_s < self._spoken_starts[-1]:
                raise ValueError("spoken character timings must come in time order")
            self.spoken.extend(spoken)
            self._spoken_starts.extend(c.start_s for c in spoken)

    def chars_before(self, audio_s: float, cursor: int = 0) -> tuple[list[CharTiming], int]:
        """The characters from `cursor` on that start before `audio_s`, and the next cursor."""
        end = max(cursor, bisect_left(self._char_starts, audio_s))
        return self.chars[cursor:end], end

    def spoken_before(self, audio_s: float, cursor: int = 0) -> tuple[list[CharTiming], int]:
        """The spoken characters from `cursor` on that start before `audio_s`, and the next
        cursor."""
        end = max(cursor, bisect_left(self._spoken_starts, audio_s))
        return self.spoken[cursor:end], end

    def words_before(self, audio_s: float, cursor: int = 0) -> tuple[list[WordTiming], int]:
        """The words from `cursor` on that start before `audio_s`, and the next cursor."""
        end = max(cursor, bisect_left(self._word_starts, audio_s))
        return self.words[cursor:end], end
