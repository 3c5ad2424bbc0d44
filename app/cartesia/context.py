"""One context of WS /tts/websocket (app/cartesia/ws.py): its engine stream and the text
the client sent on it, turned into the text the engine gets.

The engine's text is a SpokenText (pipeline/alignment.py) whose map points into the
client's text as sent, so the stream's timings index what the client wrote.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from dataclasses import dataclass, field

from app.audio import StreamEncoder
from app.cartesia.audio import PcmEncoder
from app.cartesia.schema import DEFAULT_BUFFER_DELAY_MS
from pipeline import Stream, Voice
from pipeline.alignment import SpokenText
from pipeline.engine import Reservation
from pipeline.normalize import StreamNormalizer

# a sentence mark (closing quotes or brackets after it) at the very end of the text
_SENTENCE_END = re.compile(r"[.!?\u2026][\"')\]\u201d\u2019]*$")


@dataclass(eq=False)
class Context:
    """One context: its engine stream (once admitted) and what was said on it."""

    id: str
    voice: Voice
    speed: float
    timestamps: bool
    encoder: PcmEncoder | StreamEncoder
    normalizer: StreamNormalizer | None
    reservation: Reservation | None
    stream: Stream | None = None
    task: asyncio.Task[None] | None = None
    buffer_delay_s: float = DEFAULT_BUFFER_DELAY_MS / 1000.0
    # (text, flush, release) received before the submit
    pending: list[tuple[str, bool, bool]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None  # the buffer delay's release
    text_closed: bool = False
    cancelled: bool = False
    chars: int = 0  # client characters received
    written: str = ""  # the client's text so far: the stream's text, as its timings index it
    flush_id: int = 1  # the flush_id of the text now arriving
    flushes: deque[tuple[int, int]] = field(default_factory=deque)  # (flush_id, text end)
    breaks: set[int] = field(default_factory=set)  # word ends with no space (WordCursor)

    def spoken(self, text: str, flush: bool, final: bool, *, release: bool = False) -> str:
        """`text` as the engine gets it: normalised, a SpokenText whose map points into
        the client's text (a plain str is itself). A flush (or the buffer delay's release)
        takes the text so far as complete: what the normaliser held back goes out, and a
        sentence mark at its very end ends the sentence (a space that stands for nothing
        the client sent follows it, as the engine's sentence ends need one). A flush also
        marks where the client's text before it ends."""
        normalizer = self.normalizer
        self.written += text
        spoken: str = text if normalizer is None else normalizer.push(text)
        complete = flush or release
        if normalizer is not None and (complete or final):
            spoken = spoken + normalizer.flush()
        if complete and not final and _SENTENCE_END.search(self.written):
            spoken = join_spoken(spoken, SpokenText(" ", "", ((0, 0),)))
            self.breaks.add(len(self.written))
        if flush:
            self.flushes.append((self.flush_id, len(self.written.rstrip())))
            self.flush_id += 1
        return spoken


def join_spoken(first: str, second: str) -> str:
    """`first + second`, keeping a SpokenText's map (str + SpokenText would drop it)."""
    if isinstance(second, SpokenText) and not isinstance(first, SpokenText):
        first = SpokenText.verbatim(first)
    return first + second
