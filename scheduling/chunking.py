"""Chunk planning: which codec frames each vocoder call emits, and with what context.

A stream's frames arrive in segments (one per talker call). Chunks never span segments,
and context is clipped at segment edges, because frames of two talker calls are not
continuous. Frame numbers in a Chunk are relative to its segment.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from scheduling.policies import PolicyName
from scheduling.scheduler import SchedulingConfig
from scheduling.validation import check_int, check_int_list

_log = logging.getLogger(__name__)

# Under EDF a stream's first buffer must cover the wait for its next decode; fewer frames
# than this (Piper: 4 x 11.6 ms) run dry before the next turn comes round.
MIN_FIRST_CHUNK_FRAMES = 4


@dataclass(frozen=True)
class ChunkingConfig:
    chunk_frames: int  # steady size: new frames per chunk once the ramp is over
    ramp: Sequence[int] = ()  # sizes of the first len(ramp) chunks; stored as a tuple
    left_context_frames: int = 0  # frames before a chunk decoded with it, then trimmed
    right_context_frames: int = 0  # lookahead frames decoded with a chunk, then trimmed

    def __post_init__(self) -> None:
        check_int("chunk_frames", self.chunk_frames, 1)
        object.__setattr__(self, "ramp", check_int_list("ramp", self.ramp, 1))
        check_int("left_context_frames", self.left_context_frames, 0)
        check_int("right_context_frames", self.right_context_frames, 0)

    def target_frames(self, chunk_index: int) -> int:
        """New frames chunk `chunk_index` of a stream aims for (counted across segments)."""
        if chunk_index < len(self.ramp):
            return self.ramp[chunk_index]
        return self.chunk_frames

    @property
    def first_chunk_frames(self) -> int:
        return self.target_frames(0)


def warn_if_first_chunk_too_short(
    scheduling: SchedulingConfig, chunking: ChunkingConfig, logger: logging.Logger | None = None
) -> bool:
    """Log a warning (and return True) for edf with a first chunk under 4 frames and no ramp.

    The planner knows no policy, so whoever holds both configs (the engine) calls this once.
    """
    too_short = (
        scheduling.policy == PolicyName.EDF
        and not chunking.ramp
        and chunking.first_chunk_frames < MIN_FIRST_CHUNK_FRAMES
    )
    if too_short:
        (logger or _log).warning(
            "first chunk of %d frames (< %d) under edf: the first buffer is too short to "
            "cover the next decode; raise chunk_frames or set a ramp",
            chunking.first_chunk_frames,
            MIN_FIRST_CHUNK_FRAMES,
        )
    return too_short


class Chunk(NamedTuple):
    start: int  # first new frame to emit (relative to the segment)
    stop: int  # one past the last new frame; start == stop for an empty terminal chunk
    context_start: int  # first frame to decode with it (left context, clipped)
    context_stop: int  # one past the last frame to decode (right context, clipped)
    segment: int  # the segment's index within the stream
    segment_end: bool  # this chunk closes its segment
    final: bool  # this chunk closes the stream

    @property
    def frames(self) -> int:
        return self.stop - self.start

    @property
    def empty(self) -> bool:
        return self.stop == self.start


class _Progress:
    """Where a stream's chunks have got to, twice: up to the last committed chunk
    (`emitted_*`) and up to the last chunk taken (`planned_*`), each a segment, the
    frames of it behind the cursor, the non-empty chunks so far in all segments (the
    ramp index) and whether the final chunk is behind it. Plain fields on one object:
    at 10,000 streams every object a stream keeps is one more for the garbage
    collector to walk."""

    __slots__ = (
        "emitted_chunks",
        "emitted_finished",
        "emitted_segment",
        "emitted_sent",
        "planned",
        "planned_chunks",
        "planned_finished",
        "planned_segment",
        "planned_sent",
        "tail_chunks",
        "tail_first",
        "taken",
    )

    def __init__(self) -> None:
        self.emitted_segment = self.emitted_sent = self.emitted_chunks = 0
        self.emitted_finished = False
        self.planned_segment = self.planned_sent = self.planned_chunks = 0
        self.planned_finished = False
        # taken, not committed, in order; a tuple: while none is in flight (a stream's
        # usual state) that is the shared empty tuple, not one more object per stream
        self.taken: tuple[Chunk, ...] = ()
        self.planned: Chunk | None = None  # what next_chunk last answered
        # chunks left to cut from the last segment once it is cut evenly (next_chunk's split)
        self.tail_chunks = 0
        self.tail_first = 0  # frames of the cut's first chunk, when it differs (0: even)

    def advance_planned(self, chunk: Chunk) -> None:
        (self.planned_segment, self.planned_sent, self.planned_chunks) = _advanced(
            self.planned_segment, self.planned_sent, self.planned_chunks, chunk
        )
        self.planned_finished = chunk.final
        if self.tail_chunks and chunk.stop != chunk.start:
            self.tail_chunks -= 1
            self.tail_first = 0

    def advance_emitted(self, chunk: Chunk) -> None:
        (self.emitted_segment, self.emitted_sent, self.emitted_chunks) = _advanced(
            self.emitted_segment, self.emitted_sent, self.emitted_chunks, chunk
        )
        self.emitted_finished = chunk.final


def _advanced(segment: int, sent: int, chunks: int, chunk: Chunk) -> tuple[int, int, int]:
    """A cursor (segment, frames of it sent, non-empty chunks) moved past `chunk`."""
    if chunk.stop != chunk.start:
        sent = chunk.stop
        chunks += 1
    if chunk.segment_end:
        return segment + 1, 0, chunks
    return segment, sent, chunks


class ChunkPlanner:
    """Cuts each stream's frames into chunks, one segment at a time.

    `next_chunk` answers what the next vocoder call for a stream should decode (or None
    when it should wait for frames); `commit` records that it was emitted. Every frame is
    emitted exactly once, in order, and exactly one chunk is final.

    Planning runs from "planned up to", not "emitted up to": `take` says a chunk went to
    a vocoder worker, and the next `next_chunk` answers the chunk after it (possibly in
    the next segment) while the taken one is still being decoded. Taken chunks are
    committed in the order they were taken. Without `take`, `commit` of the planned
    chunk takes and commits it at once.
    """

    def __init__(self, config: ChunkingConfig) -> None:
        self._config = config
        self._streams: dict[str, _Progress] = {}

    @property
    def config(self) -> ChunkingConfig:
        return self._config

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._streams

    def next_chunk(
        self,
        stream_id: str,
        available_frames: int,
        segment_done: bool,
        stream_done: bool,
        split: int = 1,
        urgent: bool = False,
        early_tail_frames: int = 0,
        busy_frames: int = 0,
    ) -> Chunk | None:
        """The next chunk of the current segment, or None while it must wait.

        `available_frames` counts the current segment's frames so far; `segment_done` says
        no more will come for it, `stream_done` that it is the stream's last segment.
        `split` > 1: the stream's chunks decode that many at a time (a
        lone stream on that many vocoder workers); once its last segment is all talked, the
        frames it has left past the ramp (and the first chunk) are cut into chunks of
        near-equal size, as many as steady chunks would be rounded down to a multiple of
        `split` (at least `split`), so that no short last chunk decodes alone while the
        other workers idle; later calls keep that cut. `early_tail_frames` > 0: the player
        has audio enough for chunks of that many frames to decode in time, so the cut is
        made already within the ramp (still never the first chunk) when its chunks are no
        larger: the rest of a short text decodes at once on every worker rather than
        ramp-sized chunk after chunk. `busy_frames`: the work the stream's chunks in flight
        still hold its other workers for, in frames; a cut into exactly `split` chunks
        then gives the first one (the free worker's) that much more, so that the workers
        end together (up to `early_tail_frames`). `urgent`: the stream's player is
        close to running dry; a steady chunk (past the ramp and the first chunk, whose
        sizes are chosen to cover the next decode) whose frames are all there but not its
        lookahead (the segment's next frames may come with a talker step far off) is cut
        short by its lookahead, if at least half its size is left, rather than wait for
        frames that are not its own. After the final chunk is committed the answer is
        always None.
        """
        progress = self._streams.get(stream_id)
        if progress is None:
            progress = self._streams[stream_id] = _Progress()
        if progress.planned_finished:
            return None
        sent = progress.planned_sent
        if available_frames < sent:
            raise ValueError(
                f"available_frames {available_frames} < {sent} already planned "
                f"in segment {progress.planned_segment} of {stream_id!r}"
            )
        config = self._config
        unsent = available_frames - sent
        target = config.target_frames(progress.planned_chunks)
        if (
            split > 1
            and not progress.tail_chunks
            and stream_done
            and segment_done
            and unsent > target
            and progress.planned_chunks >= 1  # never the first: first audio
        ):
            progress.tail_chunks = count = self._tail_cut(
                unsent, split, progress.planned_chunks, early_tail_frames
            )
            if count == split and busy_frames > 0:
                # the free worker's chunk first, larger by the busy ones' work left (as
                # long as the player's audio covers it, and a frame is left for each other)
                even = -(-unsent // count)
                first = min(-(-(unsent + busy_frames) // count), max(even, early_tail_frames))
                progress.tail_first = min(unsent - count + 1, first)
        if progress.tail_first:
            target = progress.tail_first
        elif progress.tail_chunks:
            target = -(-unsent // progress.tail_chunks)
        lookahead = config.right_context_frames
        chunk = None  # None: waiting for the chunk's frames and lookahead
        if unsent == 0:
            if segment_done:  # the terminal of a segment that ended on a chunk boundary
                chunk = Chunk(sent, sent, sent, sent, progress.planned_segment, True, stream_done)
        else:
            stop = None
            if segment_done or unsent >= target + lookahead:
                stop = sent + min(target, unsent)
            elif (
                urgent
                and progress.planned_chunks >= max(len(config.ramp), 1)  # never the ramp's
                and unsent >= target
                and unsent - lookahead >= -(-target // 2)
            ):
                stop = available_frames - lookahead  # cut short by its lookahead (docstring)
            if stop is not None:
                segment_end = segment_done and stop == available_frames
                # positional: start, stop, context_start, context_stop, segment, segment_end,
                # final
                chunk = Chunk(
                    sent,
                    stop,
                    max(0, sent - config.left_context_frames),
                    min(available_frames, stop + lookahead),
                    progress.planned_segment,
                    segment_end,
                    segment_end and stream_done,
                )
        progress.planned = chunk
        return chunk

    def _tail_cut(self, unsent: int, split: int, planned_chunks: int, early_frames: int) -> int:
        """How many chunks a last segment's `unsent` frames are cut into (next_chunk's
        `split`): as many as steady chunks would be, rounded down to a multiple of `split`;
        within the ramp only where each is at most `early_frames`; 0: no cut yet."""
        config = self._config
        count = -(-unsent // config.chunk_frames)
        count = max(split, count - count % split)
        if planned_chunks < len(config.ramp) and -(-unsent // count) > early_frames:
            return 0  # the ramp goes on: the player has too little audio for these chunks
        return count

    def take(self, stream_id: str, chunk: Chunk) -> None:
        """`chunk` (the one next_chunk last answered) went to a vocoder worker: planning
        goes on after it; it is committed later, after the chunks taken before it."""
        progress = self._streams.get(stream_id)
        # identity first: the planned chunk itself comes back (an equal one is accepted)
        if progress is None or (progress.planned is not chunk and progress.planned != chunk):
            raise ValueError(f"take of a chunk that was not planned for {stream_id!r}: {chunk}")
        progress.planned = None
        progress.taken += (chunk,)
        progress.advance_planned(chunk)

    def commit(self, stream_id: str, chunk: Chunk) -> None:
        """`chunk` was emitted: the oldest taken chunk or, with none taken, the one
        next_chunk last answered."""
        progress = self._streams.get(stream_id)
        if progress is not None and progress.taken:
            oldest = progress.taken[0]
            if oldest is not chunk and oldest != chunk:
                raise ValueError(
                    f"commit out of order for {stream_id!r}: {chunk}, oldest taken {oldest}"
                )
            progress.taken = progress.taken[1:]
        else:
            self.take(stream_id, chunk)
            progress = self._streams[stream_id]
            progress.taken = progress.taken[1:]
        progress.advance_emitted(chunk)

    def in_flight(self, stream_id: str) -> int:
        """Chunks taken and not yet committed."""
        progress = self._streams.get(stream_id)
        return 0 if progress is None else len(progress.taken)

    def planning_segment(self, stream_id: str) -> int:
        """The segment the next chunk comes from (0 when unknown)."""
        progress = self._streams.get(stream_id)
        return 0 if progress is None else progress.planned_segment

    def forget(self, stream_id: str) -> None:
        self._streams.pop(stream_id, None)

    def segment_index(self, stream_id: str) -> int:
        """The segment the stream is in: that of its oldest uncommitted chunk (0 when
        unknown)."""
        progress = self._streams.get(stream_id)
        return 0 if progress is None else progress.emitted_segment

    def sent_frames(self, stream_id: str) -> int:
        """Frames of the current segment already committed (0 when unknown)."""
        progress = self._streams.get(stream_id)
        return 0 if progress is None else progress.emitted_sent

    def target_frames(self, stream_id: str) -> int:
        """New frames the stream's next planned non-empty chunk aims for."""
        progress = self._streams.get(stream_id)
        return self._config.target_frames(0 if progress is None else progress.planned_chunks)

    def finished(self, stream_id: str) -> bool:
        """The final chunk was committed."""
        progress = self._streams.get(stream_id)
        return progress is not None and progress.emitted_finished
