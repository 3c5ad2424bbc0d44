"""The engine's side of a stream's alignment: segment timings -> the client's text.

Three maps lie between a talker segment's characters and the client's text:

1. the segmenter (pipeline/text.py) keeps every non-white-space character of the text it
   was given, in order, and only changes white space: a segment's non-space characters
   are the next ones of the engine's text;
2. the engine's text is the voice's (normalised) text: each of its characters stands for
   a span of the client's text (`SpokenText.spans`; a plain str stands for itself);
3. the backend's `SegmentTiming` (or, without one, an even spread over the segment's
   frames) gives each segment character its frames; the segment starts at the stream's
   frame `TalkRequest.first_frame_index`.

Consecutive spoken characters that stand for the same client span form a group; the
group's time (from its first start to its last end) is spread evenly over the span's
characters. Client characters no spoken character stands for (a space, a dropped emoji)
share the time between the groups around them (none when they touch). A group still
open when its segment's timing ends is closed there (its later spoken characters, in the
next segment, then add nothing): timings are never held back past the segment's audio.

Words are runs of non-white-space client characters; a word is appended once its last
character is timed and the character after it is known to be white space (or the text
ended).

The spoken text (the engine's text, what the voice says: "three dollars fifty" for
"$3.50") is timed too, character by character (`Alignment.spoken`): a non-space spoken
character gets its segment character's own time, never earlier than the spoken character
before it; spoken characters the segments did not time (white space between words or
segments, a character past the backend's timing) share the time between the timed ones
around them, from the end of the one before (zero duration where they touch).

Without a backend timing the segment's characters are spread evenly over its frames as
they come: a character is appended once the frames made reach its estimated start (the
segment's length estimated from the stream's frames per character so far), and what is
left is spread over the rest of the segment when it ends.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from pipeline.alignment import Alignment, CharTiming, SpokenText, WordTiming
from pipeline.backend import SegmentTiming, TalkRequest

log = logging.getLogger("playhead.engine")

DEFAULT_SECONDS_PER_CHAR = 0.07  # speech at speed 1 before any segment of the stream ended


class _EvenSpread:
    """A segment without backend timing: its characters over its frames, as they come."""

    __slots__ = ("count", "estimated_frames", "next")

    def __init__(self, count: int, estimated_frames: float) -> None:
        self.count = count
        self.estimated_frames = max(estimated_frames, 1e-9)
        self.next = 0  # characters appended so far


class StreamAligner:
    """One stream's map from talker segments to its Alignment (see the module doc). Every
    method runs on the engine's event loop (the stream book's transitions)."""

    def __init__(
        self,
        alignment: Alignment,
        seconds_per_frame: float,
        speed: float,
        sent_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """`sent_s`: the stream's audio sent so far (no timing is placed before it)."""
        self._alignment = alignment
        # timings made by the transition running now, handed to the alignment at its end
        self._chars: list[CharTiming] = []
        self._words: list[WordTiming] = []
        self._sent_s = sent_s
        self._frame_s = seconds_per_frame
        self._speed = speed
        # the client's text: characters not yet timed, from offset _client_base
        self._client = ""
        self._client_base = 0
        self._client_end = 0
        # the engine text's non-space characters not yet in an opened segment:
        # (character, client span start, client span end, offset in the spoken text)
        self._spoken: deque[tuple[str, int, int, int]] = deque()
        # the spoken text (the engine's): characters not yet timed, from offset _said_base
        self._said = ""
        self._said_base = 0
        self._said_end = 0
        self._said_next = 0  # the next spoken character to time
        self._said_start_s = 0.0  # start of the last timed spoken character
        self._said_end_s = 0.0  # end of the last timed non-space spoken character
        self._said_chars: list[CharTiming] = []  # made by the running transition
        self._next_char = 0  # the next client character to time
        self._last_end_s = 0.0  # end of the last timed group
        self._group: list[float] | None = None  # [span start, span end, start_s, end_s]
        self._word: tuple[int, float] | None = None  # (start index, start_s) of an open word
        self._word_end_s = 0.0
        # the open segment's: index, map (segment character -> spoken tuple or None),
        # frame offset, and its even spread when the backend gave no timing
        self._segment = -1
        self._segment_map: list[tuple[str, int, int, int] | None] = []
        self._segment_chars: list[int] = []  # indices of its non-space characters
        self._segment_offset = 0
        self._even: _EvenSpread | None = None
        self._frames_per_char = DEFAULT_SECONDS_PER_CHAR / seconds_per_frame / speed
        self._talked_frames = 0
        self._talked_chars = 0
        self._finished = False
        self._applied = False  # the open segment's backend timing was applied
        self._broken = False  # an error stopped this stream's alignment (its audio goes on)
        self._mismatch_logged = False

    def _guard(self, work: Callable[[], None]) -> None:
        """Run one transition; an error ends the stream's alignment, never its audio."""
        if self._broken:
            return
        try:
            work()
            if self._chars or self._words or self._said_chars:
                self._alignment.extend(self._chars, self._words, self._said_chars)
                self._chars, self._words, self._said_chars = [], [], []
        except Exception:
            self._broken = True
            log.exception("timing a stream's text failed: its alignment stops here")

    # The text.

    def add_text(self, text: str) -> None:
        """The engine's next text (a SpokenText, or a plain str standing for itself)."""
        self._guard(lambda: self._add_text(text))

    def _add_text(self, text: str) -> None:
        base, said = self._client_end, self._said_end
        if isinstance(text, SpokenText):
            source, spans = text.source, text.spans
            for i, (char, (start, end)) in enumerate(zip(text, spans, strict=True)):
                if not char.isspace():
                    self._spoken.append((char, base + start, base + end, said + i))
        else:
            source = text
            self._spoken.extend(
                (char, base + i, base + i + 1, said + i)
                for i, char in enumerate(text)
                if not char.isspace()
            )
        self._client += source
        self._client_end += len(source)
        self._said += str(text)
        self._said_end += len(text)

    # The talker.

    def talked(
        self,
        request: TalkRequest,
        segment_frames: int,
        done: bool,
        timing: SegmentTiming | None,
    ) -> None:
        """A talker step for the segment `request`: it has `segment_frames` frames so far."""
        self._guard(lambda: self._talked(request, segment_frames, done, timing))

    def _talked(
        self,
        request: TalkRequest,
        segment_frames: int,
        done: bool,
        timing: SegmentTiming | None,
    ) -> None:
        if request.segment_index != self._segment:
            self._open(request)
            self._applied = False
            if timing is None:
                estimated = len(self._segment_chars) * self._frames_per_char
                self._even = _EvenSpread(len(self._segment_chars), estimated)
        usable = self._even is None or self._even.next == 0  # nothing estimated yet
        if timing is not None and not self._applied and usable:
            # the backend's timing (on its first step with frames, as the protocol says)
            self._even = None
            self._applied = True
            self._apply(timing)
        if self._even is not None:
            self._spread(segment_frames, done)
        if done:
            self._close_group()
            if self._segment_chars and segment_frames:
                self._talked_frames += segment_frames
                self._talked_chars += len(self._segment_chars)
                self._frames_per_char = self._talked_frames / self._talked_chars
            self._segment_chars = []
            self._segment_map = []
            self._even = None

    def finish(self, total_frames: int) -> None:
        """The stream's text is all talked: time what is left of the client's text (at
        the end of the last group, up to the end of the audio) and close the last word."""
        self._guard(lambda: self._finish(total_frames))

    def _finish(self, total_frames: int) -> None:
        if self._finished:
            return
        self._finished = True
        self._close_group()
        self._emit_gap(self._client_end, total_frames * self._frame_s)
        self._said_gap(self._said_end, total_frames * self._frame_s)
        word = self._end_word(self._client_end)
        if word is not None:
            self._words.append(word)

    # Inner workings.

    def _open(self, request: TalkRequest) -> None:
        """Map the segment's characters to the engine text's (its non-space ones are the
        next spoken characters, in order)."""
        self._close_group()
        self._segment = request.segment_index
        self._segment_offset = request.first_frame_index
        mapping: list[tuple[str, int, int, int] | None] = []
        chars: list[int] = []
        spoken = self._spoken
        for index, char in enumerate(request.text):
            if char.isspace() or not spoken:
                mapping.append(None)
                continue
            entry = spoken.popleft()
            if entry[0] != char and not self._mismatch_logged:
                # the segmenter keeps every non-space character: this is a bug
                self._mismatch_logged = True
                log.warning(
                    "segment character %r met engine text %r: timings may shift", char, entry[0]
                )
            mapping.append(entry)
            chars.append(index)
        self._segment_map = mapping
        self._segment_chars = chars

    def _apply(self, timing: SegmentTiming) -> None:
        """A backend's timing of the whole open segment."""
        starts, ends = timing.start_frames, timing.end_frames
        offset = self._segment_offset
        for index in self._segment_chars:
            if index >= len(starts):
                break
            self._feed(index, (offset + starts[index]) * self._frame_s, ends[index])
        self._close_group()

    def _feed(self, index: int, start_s: float, end_frame: float) -> None:
        """Segment character `index` is heard from `start_s` to its `end_frame` (in the
        segment's frames)."""
        entry = self._segment_map[index]
        assert entry is not None
        end_s = (self._segment_offset + end_frame) * self._frame_s
        self._feed_said(entry[3], start_s, end_s)
        self._feed_span(entry[1], entry[2], start_s, end_s)

    def _spread(self, segment_frames: int, done: bool) -> None:
        """The even spread's next characters: those whose estimated start the frames
        reached, with the rest of their group (one client span); every one left when the
        segment is done, over the rest of its frames."""
        even = self._even
        assert even is not None
        offset = self._segment_offset
        chars = self._segment_chars
        if done:
            left = even.count - even.next
            if left > 0:
                begin = min(even.next * even.estimated_frames / even.count, segment_frames)
                step = (segment_frames - begin) / left
                for k in range(left):
                    start = begin + k * step
                    self._feed(chars[even.next + k], (offset + start) * self._frame_s, start + step)
                even.next = even.count
            self._close_group()
            return
        per_char = even.estimated_frames / even.count
        mapping = self._segment_map
        while even.next < even.count and even.next * per_char < segment_frames:
            span = mapping[chars[even.next]]
            while even.next < even.count and mapping[chars[even.next]][1:3] == span[1:3]:
                start = even.next * per_char
                self._feed(chars[even.next], (offset + start) * self._frame_s, start + per_char)
                even.next += 1
            self._close_group()

    def _feed_said(self, index: int, start_s: float, end_s: float) -> None:
        """Spoken character `index` (an offset in the spoken text) is heard from `start_s`
        to `end_s`: the spoken characters before it not yet timed first, then it."""
        if index < self._said_next:  # timed already (a segment that met other text: a bug)
            return
        start_s = max(start_s, self._said_start_s, self._sent_s())
        self._said_gap(index, start_s)
        self._said_chars.append(
            CharTiming(index, self._said_at(index), start_s, max(end_s - start_s, 0.0))
        )
        self._said_next = index + 1
        self._said_start_s = start_s
        self._said_end_s = max(self._said_end_s, end_s)
        drop = self._said_next - self._said_base
        if drop > 4096:
            self._said = self._said[drop:]
            self._said_base += drop

    def _said_at(self, index: int) -> str:
        return self._said[index - self._said_base]

    def _said_gap(self, stop: int, until_s: float) -> None:
        """Spoken characters [next, stop) no segment character timed (white space, mostly):
        spread from the last one's end (no earlier than its start) to `until_s`."""
        count = stop - self._said_next
        if count <= 0:
            return
        floor_s = max(self._said_start_s, self._sent_s())
        begin = min(max(self._said_end_s, floor_s), max(until_s, floor_s))
        end = max(until_s, begin)
        step = (end - begin) / count
        for k in range(count):
            index = self._said_next + k
            self._said_chars.append(CharTiming(index, self._said_at(index), begin + k * step, step))
        self._said_next = stop
        self._said_start_s = begin + (count - 1) * step

    def _feed_span(self, span_start: int, span_end: int, start_s: float, end_s: float) -> None:
        """One spoken character standing for client span [span_start, span_end)."""
        group = self._group
        if group is not None and group[0] == span_start and group[1] == span_end:
            group[3] = max(group[3], end_s)
            return
        self._close_group()
        self._group = [span_start, span_end, start_s, max(end_s, start_s)]

    def _close_group(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        span_start, span_end = max(int(group[0]), self._next_char), int(group[1])
        start_s = max(group[2], self._last_end_s)
        end_s = max(group[3], start_s)
        if span_end <= span_start:  # its span was timed already: nothing new
            return
        self._emit_gap(span_start, start_s)
        self._emit_span(span_start, span_end, start_s, end_s)

    def _emit_gap(self, stop: int, until_s: float) -> None:
        """Client characters [next, stop) that no spoken character stands for: spread from
        the last group's end to `until_s`."""
        if stop > self._next_char:
            begin = self._last_end_s
            self._emit_span(self._next_char, stop, begin, max(until_s, begin))

    def _emit_span(self, start: int, stop: int, start_s: float, end_s: float) -> None:
        """Client characters [start, stop), spread evenly over [start_s, end_s]; never
        before the audio sent already (an estimate that fell short, a trailing space known
        late: they are placed where the audio is now)."""
        sent_s = self._sent_s()
        if start_s < sent_s:
            start_s, end_s = sent_s, max(end_s, sent_s)
        count = stop - start
        step = (end_s - start_s) / count
        text = self._client
        base = self._client_base
        chars = self._chars
        words = self._words
        for k in range(count):
            index = start + k
            char = text[index - base]
            begin = start_s + k * step
            chars.append(CharTiming(index, char, begin, step))
            if char.isspace():
                word = self._end_word(index)
                if word is not None:
                    words.append(word)
                continue
            if self._word is None:
                self._word = (index, begin)
            self._word_end_s = begin + step
            after = index + 1 - base
            if after < len(text) and text[after].isspace():
                word = self._end_word(index + 1)
                if word is not None:
                    words.append(word)
        self._next_char = stop
        self._last_end_s = max(self._last_end_s, end_s)
        # keep only the client text not yet timed, and the open word's
        keep = stop if self._word is None else min(stop, self._word[0])
        drop = keep - base
        if drop > 4096:
            self._client = text[drop:]
            self._client_base = base + drop

    def _end_word(self, end_index: int) -> WordTiming | None:
        if self._word is None:
            return None
        start_index, start_s = self._word
        self._word = None
        base = self._client_base
        return WordTiming(
            self._client[start_index - base : end_index - base],
            start_index,
            end_index,
            start_s,
            max(self._word_end_s, start_s),
        )
