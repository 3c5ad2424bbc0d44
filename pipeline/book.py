"""The stream book: every live stream's engine state, and every state transition.

The book is the one owner of the streams' book-keeping. The Talker and the Vocoder
(pipeline/talker.py, pipeline/vocoder.py) read it and call its transitions; each
transition updates everything it touches (frames, chunk plans, the ready set, the talker
candidates, the scheduler, the planner, the stream's state and
audio channel) and wakes the stage that has new work. No asyncio here: the wakes are
plain callables, so the book can be driven by a virtual clock as well.

Two sets are kept incrementally, so that no turn scans every stream:

- `ready_ids`: streams whose next chunk is planned, not empty and not parked (the
  vocoder's candidates, in the order they became ready), less those whose chunk a
  vocoder worker is decoding (`start_vocoding`). Records whose frames or state changed
  are marked dirty and re-planned by `refresh` at the start of a vocoder turn.
- `ahead_ids` (with `max_in_flight` > 1): streams whose chunk a worker is decoding and
  whose NEXT chunk is planned (the talker ran ahead: its frames exist), with fewer than
  `max_in_flight` chunks in flight, once the stream's first chunk was sent (that one
  decodes alone: TTFA), while at most `work_ahead_streams` streams have work left, and
  not while a talker step of that stream runs: the talker then has the other core, and
  its frames are what the stream waits for. A
  worker takes one of these only when `ready_ids` is empty (work-conserving: no other
  stream waits for it). A stream's chunks are emitted strictly in order: a chunk decoded
  before an earlier one is held on its record (`StreamRecord.in_flight`) until the
  earlier one is emitted. Such a lone stream with `chunking.solo_slack_s` of audio
  buffered is planned solo chunks (`chunking.solo_chunk_frames`: wider, less context per
  second of audio); the others are re-planned whenever a stream comes or goes. Once
  such a stream's text is all talked its last frames are cut evenly over the workers
  (`chunking.even_tail`: the planner's `split`).
- the talker's candidates: streams with text waiting or a segment open.

A stream's talker segment (`OpenSegment`) is opened, stepped and closed in the talker
thread. When a stream ends while its segment is open, the segment is marked cancelled
and handed back to the talker (`take_orphans`), which closes it in its thread: the
backend's per-segment state is freed exactly once.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Callable, Iterator, KeysView
from dataclasses import dataclass, field

import numpy as np

from pipeline.aligner import StreamAligner
from pipeline.backend import SegmentState, SegmentTiming, TalkRequest, Voice
from pipeline.channel import AudioSender, audio_channel
from pipeline.events import EngineEvents, EngineStats
from pipeline.frames import Segment, StreamFrames
from pipeline.stream import Stream, StreamState
from pipeline.text import Segmenter
from scheduling import (
    Chunk,
    ChunkPlanner,
    PlaybackScheduler,
    StreamLoad,
    TalkerCandidate,
    TalkerOrderConfig,
    TalkerPlan,
    TalkerQueue,
)

log = logging.getLogger("playhead.engine")

_DEFAULT_AUDIO_S_PER_CHAR = 0.07  # speech at speed 1 before any measurement (~14 chars/s)


@dataclass(frozen=True)
class Wakes:
    """How the book tells a stage it has new work (an asyncio.Event's `set`, say)."""

    talker: Callable[[], None]
    vocoder: Callable[[], None]
    # a start-phase slot freed: a stream left its start phase (sent its
    # start_phase_chunks-th chunk, ended, failed, was cancelled, or now waits for its
    # client's text), or owes no more work: admission's queue may go on
    start: Callable[[], None] = lambda: None


@dataclass(slots=True, eq=False)
class InFlight:
    """A chunk a vocoder worker took, and its PCM once decoded (held until the chunks
    taken before it are emitted)."""

    chunk: Chunk
    pcm: np.ndarray | None = None
    emitted_at_s: float = 0.0
    # ends the vocode call decoding it (a call of this stream alone), where the backend can
    abort: Callable[[], None] | None = None


class OpenSegment:
    """One stream's talker segment from its opening to its close.

    `state` is the backend's, set and closed in the talker thread; `cancelled` is set on
    the event loop when the stream ends first and read in the talker thread.
    """

    __slots__ = ("cancelled", "closed", "in_flight", "record", "request", "segment", "state")

    def __init__(self, record: StreamRecord, segment: Segment, request: TalkRequest) -> None:
        self.record = record
        self.segment = segment
        self.request = request
        self.state: SegmentState | None = None
        self.cancelled = False
        self.closed = False
        self.in_flight = False  # a talker lane is stepping it


@dataclass(slots=True, eq=False)
class StreamRecord:
    """The book's state of one stream while it needs talker or vocoder work."""

    stream: Stream
    sender: AudioSender
    tag: int  # the backend's stream_tag
    order: int  # submission order (the last tie-break)
    segmenter: Segmenter
    aligner: StreamAligner  # its talker segments' timings -> stream.alignment
    text: deque[str] = field(default_factory=deque)  # segments not yet given to the talker
    text_closed: bool = False  # no more text will be appended
    text_chars: int = 0  # characters submitted so far
    frames: StreamFrames = field(default_factory=StreamFrames)
    next_segment: int = 0
    talking: OpenSegment | None = None  # the talker segment open for this stream
    chunk: Chunk | None = None  # the planner's answer, valid while the record is clean
    in_flight: deque[InFlight] = field(default_factory=deque)  # taken chunks, in order
    # the index of its next segment while the backend prepares it (prepare_segment)
    preparing: int | None = None

    @property
    def talked_all(self) -> bool:
        """No more talker work: the text is closed, no segment waits, none is open."""
        return self.text_closed and not self.text and self.talking is None


def _queued_audio_s(record: StreamRecord) -> float:
    """Audio the talker made for the stream that the vocoder has not emitted yet."""
    frames = record.frames
    voice = record.stream.voice
    return (
        (frames.produced_frames - frames.emitted_frames)
        * voice.samples_per_frame
        / voice.sample_rate_hz
    )


def _stepping(record: StreamRecord) -> bool:
    """A talker lane is stepping the stream's open segment now."""
    return record.talking is not None and record.talking.in_flight


def _talking_now(record: StreamRecord) -> bool:
    """A talker lane is stepping the stream's open segment, or the backend prepares its
    next one (the stream's talker work runs on a core now)."""
    return record.preparing is not None or _stepping(record)


def _talk_request(record: StreamRecord, text: str, index: int, *, urgent: bool) -> TalkRequest:
    """The talker's request for the stream's segment `index` of `text`."""
    stream = record.stream
    return TalkRequest(
        text=text,
        voice=stream.voice.id,
        speed=stream.speed,
        stream_tag=record.tag,
        segment_index=index,
        first_frame_index=record.frames.produced_frames,
        urgent=urgent,
    )


def _waits_for_text(record: StreamRecord) -> bool:
    """Nothing to talk or vocode until the client sends more text."""
    return (
        not record.text_closed
        and not record.text
        and record.talking is None
        and record.frames.queued_frames == 0
    )


class StreamBook:
    """See the module doc. Built by the Engine; one per engine."""

    def __init__(
        self,
        *,
        scheduler: PlaybackScheduler,
        planner: ChunkPlanner,
        segmenter: Callable[[], Segmenter],
        max_pending_audio_s: float,
        left_context_frames: int,
        first_chunk_s: float,
        clock: Callable[[], float],
        events: EngineEvents,
        wakes: Wakes,
        start_phase_chunks: int = 0,
        max_in_flight: int = 1,
        work_ahead_streams: int = 1,
        vocoder_workers: int = 1,
        first_audio_yield: bool = False,
        urgent_slack_s: float = float("inf"),
        alone_urgent_slack_s: float | None = None,
    ) -> None:
        """`max_in_flight`: most chunks of one stream decoded at once (the vocoder's
        workers); more than 1 only while no other stream has a chunk ready and at most
        `work_ahead_streams` streams have work left.
        `urgent_slack_s`: a segment opened while its stream has less audio ahead than this
        is urgent (`TalkRequest.urgent`; the default: every segment);
        `alone_urgent_slack_s` replaces it while the stream is the only one with work left
        (None: the same)."""
        self.scheduler = scheduler
        self.planner = planner
        self._new_segmenter = segmenter
        self._max_pending_audio_s = max_pending_audio_s
        self._left_context_frames = left_context_frames
        self._clock = clock
        self._events = events
        self._wakes = wakes
        self._streams: dict[str, tuple[Stream, AudioSender]] = {}  # every non-terminal stream
        self._records: dict[str, StreamRecord] = {}  # streams with work left, by arrival
        # streams with text waiting or a segment open, indexed for the talker's order
        self.talker_queue = TalkerQueue(first_chunk_s)
        self._dirty: dict[str, StreamRecord] = {}  # chunk plan out of date
        self._ready: dict[str, None] = {}  # a non-empty chunk planned, not parked
        self._vocoding: set[str] = set()  # their chunk is being decoded (start_vocoding)
        # in _vocoding, next chunk planned, fewer than max_in_flight in flight
        self._ahead: dict[str, None] = {}
        self._max_in_flight = max(1, max_in_flight)
        self._work_ahead_streams = work_ahead_streams
        self._vocoder_workers = max(1, vocoder_workers)
        self._turns = 0  # vocoder turns running now (turn_started .. turn_ended)
        # first_audio_yield: the stages count their calls that make a stream's first audio
        # (`first_audio_started` .. `first_audio_ended`), for vocoder.yield_slack_s
        self.first_audio_yield = first_audio_yield
        self.first_audio_work = 0  # such calls running now
        self._vocoder_yielded = False  # a worker waits for them to end
        self._urgent_slack_s = urgent_slack_s  # TalkRequest.urgent below this
        self._alone_urgent_slack_s = (  # ... while a stream is the only one with work
            urgent_slack_s if alone_urgent_slack_s is None else alone_urgent_slack_s
        )
        # solo chunks (chunking.solo_chunk_frames): a stream alone on the vocoder (as for
        # work-ahead) with this much audio buffered is planned wider chunks; None: off
        chunking = planner.config
        self._solo_slack_s: float | None = (
            chunking.solo_slack_s
            if chunking.solo_chunk_frames > chunking.chunk_frames and self._max_in_flight > 1
            else None
        )
        # a lone stream's last chunks are cut evenly over the workers (chunking.even_tail;
        # `_may_work_ahead` holds only with more than one)
        self._even_tail = chunking.even_tail
        self._orphans: list[OpenSegment] = []  # segments of ended streams, to close
        self._talker_waits_on_vocoder = False  # the talker's last plan was empty
        self._talker_waits_on_emit = False  # ... and paced by the frames waiting
        self._pace_on_full_workers = False  # the talker's order has busy_max_queued_s
        self._paced_order: tuple[TalkerOrderConfig, TalkerOrderConfig] | None = None
        # streams in their start phase: fewer than `start_phase_chunks` chunks sent yet
        # (0: not tracked); admission counts their start_cost
        self._start_phase_chunks = start_phase_chunks
        self._starting: dict[str, None] = {}
        self._submitted = 0
        self._talked_chars = 0
        self._talked_audio_s = 0.0  # at speed 1

    # Queries.

    def __len__(self) -> int:
        """Streams with work left."""
        return len(self._records)

    def record(self, stream_id: str) -> StreamRecord | None:
        return self._records.get(stream_id)

    def stream(self, stream_id: str) -> Stream | None:
        entry = self._streams.get(stream_id)
        return None if entry is None else entry[0]

    def stream_ids(self) -> list[str]:
        """Every non-terminal stream (draining ones included)."""
        return list(self._streams)

    @property
    def ready_ids(self) -> KeysView[str] | list[str]:
        """Streams with a non-empty chunk planned (valid after `refresh`) whose chunk no
        vocoder worker is decoding."""
        return self._not_vocoding(self._ready)

    def _not_vocoding(self, ids: dict[str, None]) -> KeysView[str] | list[str]:
        """`ids` less the streams a worker is decoding, in order (the keys themselves
        when none is: no copy)."""
        if not self._vocoding:
            return ids.keys()
        vocoding = self._vocoding
        return [stream_id for stream_id in ids if stream_id not in vocoding]

    @property
    def ahead_ids(self) -> KeysView[str] | list[str]:
        """Streams whose chunk a worker is decoding and whose next chunk is planned (valid
        after `refresh`), fewer than `max_in_flight` in flight: for a worker that finds
        `ready_ids` empty. Empty while more than `work_ahead_streams` streams have work
        left: the CPU is then busy with their talker work, which a chunk decoded ahead
        would only slow down. A stream whose talker step runs now, or whose next segment
        the backend prepares, is left out (the vocoder is woken at `talk_steps_ended` and
        `prepare_ended`): on a CPU a third thread would take from the talker, whose frames
        the stream needs next."""
        if not self._may_work_ahead():
            return {}.keys()
        ahead = self._ahead
        if not ahead:
            return ahead.keys()
        records = self._records
        return [stream_id for stream_id in ahead if not _talking_now(records[stream_id])]

    def _may_work_ahead(self) -> bool:
        """A stream may have more than one chunk in flight now (work-ahead): with many
        streams the book behaves as if it were off, at no extra cost."""
        return self._max_in_flight > 1 and len(self._records) <= self._work_ahead_streams

    def talker_candidates(self) -> Iterator[TalkerCandidate]:
        """Streams that want talker work (parked ones left out)."""
        for candidate in self.talker_queue.candidates():
            if not self._records[candidate.stream_id].sender.parked:
                yield candidate

    def plan_talker(self, now_s: float, order: TalkerOrderConfig) -> TalkerPlan:
        """The streams for the next talker step (scheduling.TalkerQueue's plan; parked
        streams and those a talker lane is stepping pass)."""
        run_ahead = order.run_ahead
        # with a cap on frames waiting, every worker decoding counts as busy too
        self._pace_on_full_workers = order.busy_max_queued_s is not None
        paced = not self._vocoder_idle()
        if paced:
            # run ahead only when the machine would otherwise idle, and make no more frames
            # than the vocoder can use soon: the vocoder shares the CPU, and a chunk it has
            # waiting is more urgent than any talk ahead of it
            order = self._paced(order)
        plan = self.talker_queue.plan(now_s, order, skip=self._busy)
        waits = not plan.step_ids and len(self.talker_queue) > 0
        # an idle talker that may run ahead waits on the vocoder: it is woken once the
        # vocoder leaves a core idle (start_vocoding, emit, turn_ended)
        self._talker_waits_on_vocoder = run_ahead and waits
        # one held back by the frames it has waiting is woken by the next chunk sent
        self._talker_waits_on_emit = waits and order.max_queued_s is not None
        return plan

    def _vocoder_idle(self) -> bool:
        """The vocoder would leave a core idle: no chunk is ready that no worker has taken
        (as of the last refresh), and, where the talker's order caps the frames waiting
        (`busy_max_queued_s`: the stages share cores), a worker is free or only the
        streams that may work ahead have work (a lone request's talker and vocoder then
        run side by side: all its work is due, none is another stream's)."""
        if len(self._ready) != len(self._vocoding):
            return False
        return (
            not self._pace_on_full_workers
            or self._turns < self._vocoder_workers
            or len(self._records) <= self._work_ahead_streams
        )

    @property
    def turns_running(self) -> int:
        """Vocoder turns between `turn_started` and `turn_ended` now (0: every worker
        waits for work)."""
        return self._turns

    def turn_started(self) -> None:
        """A vocoder worker started a turn (the talker paces while every worker is busy)."""
        self._turns += 1

    def turn_ended(self) -> None:
        """A vocoder worker's turn ended, emitted or failed: a worker is free."""
        self._turns -= 1
        self._wake_idle_talker()

    def _paced(self, order: TalkerOrderConfig) -> TalkerOrderConfig:
        if self._paced_order is None or self._paced_order[0] is not order:
            self._paced_order = (order, order.paced())
        return self._paced_order[1]

    def _wake_idle_talker(self) -> None:
        """The talker waits for the vocoder to have nothing waiting: wake it now if so."""
        if self._talker_waits_on_vocoder and self._vocoder_idle():
            self._talker_waits_on_vocoder = False
            self._wakes.talker()

    def plan_first_audio_talker(self, now_s: float, order: TalkerOrderConfig) -> tuple[str, ...]:
        """Streams with no audio yet, for a second talker lane."""
        return self.talker_queue.plan_first_audio(now_s, order, skip=self._busy)

    def _busy(self, stream_id: str) -> bool:
        record = self._records[stream_id]
        return record.sender.parked or _stepping(record)

    @property
    def mean_stream_audio_s(self) -> float:
        """Audio talked per stream submitted, at speed 1 (inf before any was talked)."""
        return self._talked_audio_s / self._submitted if self._talked_audio_s else math.inf

    def loads(self, start_chunk_audio_s: float) -> list[StreamLoad]:
        """What each stream with work left still owes, for admission: its audio left
        (the text's estimated length less what was sent; inf while its text is open), and
        while it starts, `start_chunk_audio_s` per start-phase chunk still to send."""
        per_char_s = (
            self._talked_audio_s / self._talked_chars
            if self._talked_chars
            else _DEFAULT_AUDIO_S_PER_CHAR
        )
        starting, chunks = self._starting, self._start_phase_chunks
        loads = []
        for stream_id, record in self._records.items():
            stream = record.stream
            owed_s = record.text_chars * per_char_s / stream.speed - stream.stats.audio_s
            owed_s = max(owed_s, start_chunk_audio_s) if record.text_closed else math.inf
            left = 0
            if stream_id in starting and not _waits_for_text(record):
                left = chunks - stream.stats.chunks
            loads.append(StreamLoad(owed_s, max(0, left) * start_chunk_audio_s))
        return loads

    def orphan(self, opened: OpenSegment) -> None:
        """A cancelled segment whose backend state is still open: the talker closes it."""
        if opened.state is not None and not opened.closed and opened not in self._orphans:
            self._orphans.append(opened)
            self._wakes.talker()

    @property
    def has_orphans(self) -> bool:
        return bool(self._orphans)

    def take_orphans(self) -> list[OpenSegment]:
        """Segments of ended streams that the talker must close."""
        orphans, self._orphans = self._orphans, []
        return orphans

    def stats(self, capacity_audio_s_per_s: float) -> EngineStats:
        records = self._records.values()
        return EngineStats(
            active_streams=len(self._records),
            parked_streams=sum(1 for r in records if r.sender.parked),
            capacity_audio_s_per_s=capacity_audio_s_per_s,
            policy=self.scheduler.policy_name,
            draining_streams=len(self._streams) - len(self._records),
            queued_frames=sum(r.frames.queued_frames for r in records),
        )

    def traces(self, stream_id: str) -> list[str]:
        """Where the book still holds this stream (empty once it is finished)."""
        places = []
        if stream_id in self._streams:
            places.append("streams")
        record = self._records.get(stream_id)
        if record is not None:
            places.append("record")
            if record.in_flight:
                places.append("in-flight")
            if record.frames.held_frames or record.frames.segment_count:
                places.append("frames")
            if record.talking is not None:
                places.append("talker")
        for name, index in (
            ("talker-candidates", self.talker_queue),
            ("dirty", self._dirty),
            ("ready", self._ready),
            ("vocoding", self._vocoding),
            ("ahead", self._ahead),
        ):
            if stream_id in index:
                places.append(name)
        if any(o.record.stream.id == stream_id for o in self._orphans):
            places.append("orphans")
        if stream_id in self.scheduler:
            places.append("scheduler")
        if stream_id in self.planner:
            places.append("planner")
        return places

    # Transitions: streams and text.

    def add_stream(self, voice: Voice, *, speed: float, now_s: float) -> Stream:
        """A newly admitted stream, with no text yet."""
        self._submitted += 1
        stream_id = uuid.uuid4().hex
        sender, receiver = audio_channel(
            stream_id, voice.sample_rate_hz, self._max_pending_audio_s, self
        )
        stream = Stream(stream_id, voice, speed=speed, submitted_at_s=now_s, audio=receiver)
        self._streams[stream_id] = (stream, sender)
        self._records[stream_id] = StreamRecord(
            stream=stream,
            sender=sender,
            tag=self._submitted,
            order=self._submitted,
            segmenter=self._new_segmenter(),
            aligner=StreamAligner(
                stream.alignment,
                voice.samples_per_frame / voice.sample_rate_hz,
                speed,
                lambda: stream.stats.audio_s,
            ),
        )
        if self._start_phase_chunks:
            self._starting[stream_id] = None
        if self._solo_slack_s is not None and len(self._records) == self._work_ahead_streams + 1:
            self._replan_others(stream_id)  # no stream is alone now: plain chunks again
        self.scheduler.admit(stream_id, now_s)  # its first-chunk deadline counts from now
        self._events.stream_started(stream_id)
        return stream

    def add_text(self, stream_id: str, text: str, *, final: bool, flush: bool = False) -> None:
        """More text for a live stream; `flush` cuts there: the text so far is spoken without
        waiting for its sentence to end (more may follow), `final` ends the text."""
        record = self._records.get(stream_id)
        if record is None or record.text_closed:
            raise ValueError(f"stream {stream_id} takes no more text")
        record.aligner.add_text(text)
        segments = record.segmenter.push(text)
        if final or flush:
            segments += record.segmenter.flush()
        record.text_closed = final
        record.text.extend(segments)
        record.text_chars += len(text)
        if record.text:
            self._update_candidate(record)
            self._wakes.talker()
        if final:
            if record.talked_all:
                record.aligner.finish(record.frames.produced_frames)
            if record.talked_all and record.stream.state is StreamState.TALKING:
                record.stream.state = StreamState.VOCODING
            self._mark_dirty(record)  # the planner learns whether the stream may end
            self._check_finished(record)

    def ack_playback(self, stream_id: str, played_s: float, now_s: float) -> None:
        """Client truth about its playback; ignored before the stream's first audio."""
        record = self._records.get(stream_id)
        if record is not None and self.scheduler.horizon_s(stream_id) is not None:
            self.scheduler.ack_playback(stream_id, played_s, now_s)
            self._update_candidate(record)
            self._wakes.talker()  # the talker order may change
            if self._solo_slack_s is not None:
                self._mark_dirty(record)  # its slack moved: a solo chunk may (not) fit

    # Transitions: the talker.

    def open_segment(self, record: StreamRecord) -> OpenSegment:
        """The talker takes the stream's next text segment."""
        stream = record.stream
        text = record.text.popleft()
        # a preparation of this segment (prepare_started) ends here for the book, whatever
        # its own end: the talker lane that opens the segment takes or waits for it (a
        # talker call that failed before it started the preparation holds nothing longer)
        record.preparing = None
        index = record.next_segment
        record.next_segment += 1
        request = _talk_request(record, text, index, urgent=self._urgent(record))
        opened = OpenSegment(record, record.frames.open_segment(index), request)
        record.talking = opened
        if stream.state is StreamState.QUEUED:
            stream.state = StreamState.TALKING
        return opened

    def next_request(self, record: StreamRecord) -> TalkRequest | None:
        """The request `open_segment` would make for the stream's next text segment (not
        taken; for `backend.prepare_segment`), or None when no text waits. Its `urgent` and
        `first_frame_index` are as of now: the segment is opened later."""
        if not record.text:
            return None
        return _talk_request(record, record.text[0], record.next_segment, urgent=False)

    def _urgent(self, record: StreamRecord) -> bool:
        """The stream's player needs its next frames soon: no audio made yet, or less than
        `urgent_slack_s` of audio ahead of it (in the player, and talked not yet vocoded:
        before its first audio is sent, only the latter);
        `alone_urgent_slack_s` while it is the only stream with work left."""
        slack_s = self.scheduler.slack_s(record.stream.id, self._clock())
        queued_s = _queued_audio_s(record)
        if slack_s is None:  # no audio sent yet: urgent unless the talker made some already
            if queued_s <= 0.0:
                return True
            slack_s = 0.0
        limit_s = self._alone_urgent_slack_s if len(self._records) == 1 else self._urgent_slack_s
        return max(slack_s, 0.0) + queued_s < limit_s

    def talked(
        self,
        opened: OpenSegment,
        frames: np.ndarray,
        done: bool,
        timing: SegmentTiming | None = None,
    ) -> None:
        """One talker step's outcome for one segment (`timing`: the backend's, if any)."""
        record = opened.record
        if opened.cancelled:  # the stream ended during the step
            self.orphan(opened)
            return
        stream = record.stream
        if len(frames):
            record.frames.append(opened.segment, frames)
            stream.stats.frames += len(frames)
            self._mark_dirty(record)
        # the timings of these frames go to stream.alignment before they can be vocoded
        record.aligner.talked(opened.request, opened.segment.available_frames, done, timing)
        if not done:
            self._update_candidate(record)
            return
        opened.segment.done = True
        record.talking = None
        stream.stats.segments += 1
        voice = stream.voice
        audio_s = opened.segment.available_frames * voice.samples_per_frame / voice.sample_rate_hz
        self._talked_chars += len(opened.request.text)
        self._talked_audio_s += audio_s * stream.speed
        self._update_candidate(record)
        if record.talked_all:
            record.aligner.finish(record.frames.produced_frames)
            stream.state = StreamState.VOCODING
        self._mark_dirty(record)
        self._check_finished(record)

    def talk_steps_started(self, batch: list[OpenSegment]) -> None:
        """A talker lane steps these segments now (they pass the talker's next plans)."""
        for opened in batch:
            opened.in_flight = True

    def talk_steps_ended(self, batch: list[OpenSegment]) -> None:
        """A talker lane's step of these segments ended (its outcome was booked)."""
        for opened in batch:
            opened.in_flight = False
        ahead = self._ahead
        if any(opened.record.stream.id in ahead for opened in batch):
            self._wakes.vocoder()  # a chunk ahead was held back during the step: take it now

    def prepare_started(self, record: StreamRecord, segment_index: int) -> None:
        """The backend prepares the stream's segment `segment_index` now (its next one;
        talker.prepare_ahead_streams)."""
        record.preparing = segment_index

    def prepare_ended(self, stream_id: str, segment_index: int) -> None:
        """That preparation ended (done, dropped or failed). A late end of one whose segment
        was opened meanwhile (the book's hold ended there) changes nothing."""
        record = self._records.get(stream_id)
        if record is None or record.preparing != segment_index:
            return
        record.preparing = None
        if stream_id in self._ahead:
            self._wakes.vocoder()  # a chunk ahead was held back meanwhile: take it now

    # Transitions: work on a stream's first audio (with first_audio_yield).

    def first_audio_started(self) -> None:
        """A talker step or vocoder turn that makes some stream's first audio began."""
        self.first_audio_work += 1

    def first_audio_ended(self) -> None:
        self.first_audio_work -= 1
        if not self.first_audio_work and self._vocoder_yielded:
            self._vocoder_yielded = False
            self._wakes.vocoder()

    def vocoder_yielded(self) -> None:
        """A vocoder worker waits for the first-audio work to end (it is woken then)."""
        self._vocoder_yielded = True

    # Transitions: the vocoder.

    def refresh(self) -> None:
        """Re-plan the dirty records: the ready set is then up to date. Empty (terminal)
        chunks carry no audio and are committed here, without a turn."""
        dirty = self._dirty
        vocoding, ready, plan = self._vocoding, self._ready, self._plan
        while dirty:
            stream_id, record = dirty.popitem()
            if stream_id in vocoding:
                if self._may_work_ahead():
                    self._plan_ahead(record)
                continue  # otherwise re-planned once its chunk is committed
            chunk = plan(record)
            record.chunk = chunk
            if chunk is None or record.sender.parked:
                ready.pop(stream_id, None)
            elif chunk.stop == chunk.start:  # empty
                ready.pop(stream_id, None)
                self._commit(record, chunk)
            else:
                ready[stream_id] = None
        if self._talker_waits_on_vocoder:
            self._wake_idle_talker()  # the vocoder may have nothing waiting now

    def _plan_ahead(self, record: StreamRecord) -> None:
        """A stream with chunks in flight: plan the chunk after them, for `ahead_ids`."""
        stream_id = record.stream.id
        chunk = None
        if (
            len(record.in_flight) < self._max_in_flight
            and not record.sender.parked
            # not before its first audio: the first chunk gets a core to itself (TTFA)
            and record.stream.stats.chunks > 0
        ):
            chunk = self._plan(record)
        record.chunk = chunk
        if chunk is None or chunk.empty:  # an empty terminal waits for the ones in flight
            self._ahead.pop(stream_id, None)
        else:
            self._ahead[stream_id] = None

    def start_vocoding(self, record: StreamRecord) -> None:
        """A vocoder worker took the stream's planned chunk (`record.chunk`): it is in
        flight until emitted (`emit`) or the stream ends. With `max_in_flight` 1 no
        worker takes the stream again until then; with more, the chunk after it is
        planned and offered in `ahead_ids`."""
        chunk = record.chunk
        assert chunk is not None and chunk.stop != chunk.start, chunk
        stream_id = record.stream.id
        self.planner.take(stream_id, chunk)
        record.in_flight.append(InFlight(chunk))
        record.chunk = None
        self._vocoding.add(stream_id)
        if self._ahead:
            self._ahead.pop(stream_id, None)
        if self._max_in_flight > 1 and self._may_work_ahead():
            self._mark_dirty(record)  # its next chunk may be decoded beside this one
        if self._talker_waits_on_vocoder:
            self._wake_idle_talker()  # it may have been the last chunk waiting

    def emit(
        self, record: StreamRecord, chunk: Chunk, pcm: np.ndarray, emitted_at_s: float
    ) -> None:
        """One taken chunk's PCM left the vocoder. Sent at once when every chunk taken
        before it is sent; otherwise held until they are, then sent after them."""
        in_flight = record.in_flight
        if len(in_flight) == 1 and in_flight[0].chunk is chunk:
            # the usual case: the one chunk in flight leaves at once
            if self._records.get(record.stream.id) is record:
                in_flight.popleft()
                self._send_chunk(record, chunk, pcm, emitted_at_s)
            else:
                entry = in_flight[0]
                entry.pcm, entry.emitted_at_s = pcm, emitted_at_s
            return
        for entry in in_flight:
            if entry.chunk is chunk:
                entry.pcm, entry.emitted_at_s = pcm, emitted_at_s
                break
        else:
            raise ValueError(f"emit of a chunk not in flight for {record.stream.id}: {chunk}")
        while in_flight and in_flight[0].pcm is not None and self.is_live(record):
            entry = in_flight.popleft()
            assert entry.pcm is not None
            # a held chunk leaves with the one it waited for
            self._send_chunk(record, entry.chunk, entry.pcm, max(entry.emitted_at_s, emitted_at_s))

    def _send_chunk(
        self, record: StreamRecord, chunk: Chunk, pcm: np.ndarray, emitted_at_s: float
    ) -> None:
        """A chunk's PCM, in order: account for it, send it, commit the chunk."""
        stream = record.stream
        stream_id = stream.id
        stats = stream.stats
        scheduler = self.scheduler
        size = pcm.size
        horizon_s = scheduler.horizon_s(stream_id)
        if horizon_s is not None and emitted_at_s > horizon_s:
            stall_s = emitted_at_s - horizon_s
            stats.stalls += 1
            stats.stall_s += stall_s
            self._events.stall(stream_id, stall_s)
        scheduler.record_audio(stream_id, size, stream.sample_rate_hz, emitted_at_s)
        if stats.ttfa_s is None:
            stats.ttfa_s = emitted_at_s - stats.submitted_at_s
            self._events.first_audio(stream_id, stats.ttfa_s)
            self._wakes.talker()  # its playback starts: the high-water mark now moves
        stats.audio_s += size / stream.sample_rate_hz
        stats.chunks += 1
        left_start = stats.chunks == self._start_phase_chunks
        if left_start:
            left_start = self._starting.pop(stream_id, False) is None
        record.sender.send(pcm)
        self._commit(record, chunk)
        if self._records.get(stream_id) is record:  # still live
            self._update_candidate(record)
            if self._talker_waits_on_emit:  # frames waiting for the vocoder went down
                self._talker_waits_on_emit = False
                self._wakes.talker()
            elif self._talker_waits_on_vocoder:
                self._wake_idle_talker()
            # a live-text stream that sent all it had stops counting as starting
            if not left_start and self._starting:
                left_start = stream_id in self._starting and _waits_for_text(record)
        if left_start:
            self._wakes.start()

    def is_live(self, record: StreamRecord) -> bool:
        return self._records.get(record.stream.id) is record

    # Transitions: endings.

    def cancel(self, stream_id: str) -> None:
        """End a stream now (caller, client gone, engine stop); frees every trace."""
        entry = self._streams.get(stream_id)
        if entry is None:
            return
        stream, sender = entry
        record = self._records.get(stream_id)
        if record is not None:
            self._drop(record)
        stream.state = StreamState.CANCELLED
        sender.cancel()
        self._finalize(stream)

    def cancel_all(self) -> None:
        for stream_id in list(self._streams):
            self.cancel(stream_id)

    def fail(self, record: StreamRecord, error: BaseException) -> None:
        """A backend call failed for this stream: end it with the error."""
        stream = record.stream
        if not self.is_live(record):
            return
        log.warning("stream %s failed: %r", stream.id, error)
        self._drop(record)
        stream.state = StreamState.FAILED
        record.sender.fail(error)
        self._finalize(stream)

    def fail_all(self, error: BaseException) -> None:
        for record in list(self._records.values()):
            self.fail(record, error)

    # The audio channel's listener.

    def audio_unparked(self, stream_id: str) -> None:
        record = self._records.get(stream_id)
        if record is not None:
            self._mark_dirty(record)
            self._wakes.talker()

    def audio_read_all(self, stream_id: str) -> None:
        stream = self.stream(stream_id)
        if stream is not None and stream.state is StreamState.DRAINING:
            stream.state = StreamState.DONE
            self._finalize(stream)

    def audio_abandoned(self, stream_id: str) -> None:
        self.cancel(stream_id)

    # Internals.

    def _update_candidate(self, record: StreamRecord) -> None:
        """Keep the talker's queue in step: a stream wants talker work while it has text
        waiting or a segment open; its horizon or queued audio may have moved."""
        stream = record.stream
        if not record.text and record.talking is None:
            self.talker_queue.remove(stream.id)
            return
        stream_id = stream.id
        state = self.scheduler.state(stream_id)
        queued_s = _queued_audio_s(record)
        if state is None:
            first_seen_s, horizon_s = stream.stats.submitted_at_s, None
        else:
            first_seen_s, horizon_s = state.first_seen_s, state.horizon_s
        # positional: the fields in their declared order (stream_id, order, first_seen_s,
        # horizon_s, queued_audio_s)
        self.talker_queue.update(
            TalkerCandidate(stream_id, record.order, first_seen_s, horizon_s, queued_s)
        )

    def _mark_dirty(self, record: StreamRecord) -> None:
        self._dirty[record.stream.id] = record
        self._wakes.vocoder()

    def _replan_others(self, stream_id: str) -> None:
        """Whether a stream is alone changed (a stream came or went): re-plan the others
        (at most `work_ahead_streams` of them), whose chunk size depends on it."""
        for other_id, other in self._records.items():
            if other_id != stream_id:
                self._mark_dirty(other)

    def _solo(self, stream_id: str, threshold_s: float) -> bool:
        """The stream may be planned a solo chunk: it is alone on the vocoder and its
        player has `threshold_s` (`chunking.solo_slack_s`) or more of audio buffered."""
        if not self._may_work_ahead():
            return False
        slack_s = self.scheduler.slack_s(stream_id, self._clock())
        return slack_s is not None and slack_s >= threshold_s

    def _plan(self, record: StreamRecord) -> Chunk | None:
        frames = record.frames
        stream_id = record.stream.id
        if record.in_flight:  # the planner plans after the chunks in flight
            segment = frames.segment(self.planner.planning_segment(stream_id))
        else:
            segment = frames.current
        if segment is None:
            return None
        done = segment.done
        # record.talked_all and frames.is_last(segment), spelled out
        stream_done = (
            done
            and record.text_closed
            and not record.text
            and record.talking is None
            and frames.is_last(segment)
        )
        # (the solo test costs nothing where solo chunks are off: the sim, the codec LM)
        threshold_s = self._solo_slack_s
        solo = threshold_s is not None and self._solo(stream_id, threshold_s)
        # a lone stream's last frames are cut evenly over the workers that decode them
        split = (
            self._max_in_flight if stream_done and self._even_tail and self._may_work_ahead() else 1
        )
        return self.planner.next_chunk(
            stream_id, segment.available_frames, done, stream_done, solo, split
        )

    def _commit(self, record: StreamRecord, chunk: Chunk) -> None:
        """The chunk left (or, empty, needed no decode): advance the planner, free frames."""
        stream_id = record.stream.id
        self.planner.commit(stream_id, chunk)
        if not record.in_flight:
            self._vocoding.discard(stream_id)
            if self._ahead:
                self._ahead.pop(stream_id, None)
        frames = record.frames
        frames.emitted(chunk.stop - chunk.start, free_before=chunk.stop - self._left_context_frames)
        record.chunk = None
        assert frames.queued_frames >= 0, "emitted more frames than the talker produced"
        if chunk.segment_end:
            frames.close_current()
        if chunk.final:
            assert record.talked_all and record.frames.segment_count == 0
            self._finish_vocoding(record)
            return
        self._mark_dirty(record)
        if chunk.segment_end:
            self._check_finished(record)

    def _check_finished(self, record: StreamRecord) -> None:
        """A stream whose text is all talked and whose segments are all emitted is done."""
        if self.is_live(record) and record.talked_all and record.frames.segment_count == 0:
            self._finish_vocoding(record)

    def _finish_vocoding(self, record: StreamRecord) -> None:
        stream = record.stream
        self._drop(record)
        stream.state = StreamState.DRAINING
        record.sender.close()

    def _drop(self, record: StreamRecord) -> None:
        """Free every trace of a stream's work."""
        stream_id = record.stream.id
        del self._records[stream_id]
        self._starting.pop(stream_id, None)
        self.talker_queue.remove(stream_id)
        self._dirty.pop(stream_id, None)
        self._ready.pop(stream_id, None)
        self._vocoding.discard(stream_id)
        self._ahead.pop(stream_id, None)
        for entry in record.in_flight:  # its decodes in flight are of no use now
            if entry.abort is not None and entry.pcm is None:
                entry.abort()
        record.in_flight.clear()
        opened = record.talking
        if opened is not None:
            record.talking = None
            opened.cancelled = True
            self.orphan(opened)
        record.text.clear()
        record.frames.clear()
        record.chunk = None
        self.scheduler.forget(stream_id)
        self.planner.forget(stream_id)
        if self._solo_slack_s is not None and len(self._records) == self._work_ahead_streams:
            self._replan_others(stream_id)  # the streams left are alone: solo chunks
        self._wakes.vocoder()  # under fifo its slot is free now
        self._wakes.start()  # it owes no more work: admission may grant a waiter

    def _finalize(self, stream: Stream) -> None:
        stats = stream.stats
        stats.finished_at_s = self._clock()
        self._streams.pop(stream.id, None)
        log.info(
            "stream %s %s ttfa_ms=%s start_wait_ms=%.0f audio_s=%.2f stalls=%d stall_s=%.3f"
            " policy=%s",
            stream.id,
            stream.state.value,
            "-" if stats.ttfa_s is None else f"{stats.ttfa_s * 1000:.0f}",
            stats.start_wait_s * 1000,
            stats.audio_s,
            stats.stalls,
            stats.stall_s,
            self.scheduler.policy_name,
        )
        self._events.stream_finished(stats, stream.state)
