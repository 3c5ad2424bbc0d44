"""The stream table: the live streams, their records, and their terminal transitions.

The table holds every non-terminal stream (draining ones included: their audio is sent,
their reader has not read it all) and a record (pipeline/records.py) for each stream that
still needs talker or vocoder work. It knows nothing of the stages: a stage core that
keeps an index of streams registers a `forget` callable, and every way a stream's work
ends (`finish`, `fail`, `cancel`) calls them all, so no index outlives its stream.

Its audio channel's reader does not call into the table: what the reader reports (it
read everything, it left, a parked channel drained) goes into an inbox (`reader_event`)
and is applied by `apply_inbox` at the next step boundary, when a stage driver plans its
next call. A cancel by the engine (its caller, a client's disconnect seen by the app) is
applied at once: it comes from the event loop between steps.

One measure of load, `load()`, is built from it once per stage turn (pipeline/load.py).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Callable

from pipeline.aligner import StreamAligner
from pipeline.backend import Voice
from pipeline.channel import AudioSender, ReaderEvent, audio_channel
from pipeline.events import EngineEvents, EngineStats
from pipeline.load import Load
from pipeline.records import StreamRecord
from pipeline.stream import Stream, StreamState
from pipeline.text import Segmenter
from scheduling import FirstAudioWindow, PlaybackScheduler, StreamLoad

log = logging.getLogger("playhead.engine")

_DEFAULT_AUDIO_S_PER_CHAR = 0.07  # speech at speed 1 before any measurement (~14 chars/s)


class StreamTable:
    """See the module doc. Built by the StreamBook; one per engine."""

    def __init__(
        self,
        *,
        scheduler: PlaybackScheduler,
        segmenter: Callable[..., Segmenter],  # called with language=the voice's
        max_pending_audio_s: float,
        clock: Callable[[], float],
        events: EngineEvents,
        wake: Callable[[], None],
        start_phase_chunks: int = 0,
        start_ahead_frames: int = 0,
        start_freed: Callable[[], None] = lambda: None,
    ) -> None:
        """`wake`: a reader event waits in the inbox (the stage drivers apply it).
        `start_phase_chunks`: a stream counts as starting until it sent this many chunks
        (0: not tracked) and its talker made `start_ahead_frames` frames past them (the
        frames its first steady chunk needs, context included), or all its text, or it
        waits for more text; `start_freed` is called when one stops starting or ends."""
        self.scheduler = scheduler
        self._new_segmenter = segmenter
        self._max_pending_audio_s = max_pending_audio_s
        self._clock = clock
        self._events = events
        self._wake = wake
        self._start_freed = start_freed
        # the latest whole-text streams' submit -> first audio (admission's bound)
        self.first_audio = FirstAudioWindow()
        # every non-terminal stream, with its channel's send half
        self._streams: dict[str, tuple[Stream, AudioSender]] = {}
        self._records: dict[str, StreamRecord] = {}  # streams with work left, by arrival
        self._forget: list[Callable[[StreamRecord], None]] = []
        self._unparked: list[Callable[[StreamRecord], None]] = []
        self._inbox: deque[tuple[str, ReaderEvent]] = deque()
        self._start_phase_chunks = start_phase_chunks
        self._start_ahead_frames = start_ahead_frames
        self._starting: dict[str, None] = {}  # in their start phase
        # live-text streams that sent all they had and wait for their client's next text
        # (no work now: they do not count against a stream being alone)
        self._idle: set[str] = set()
        self._submitted = 0  # every stream (its tag and arrival order)
        self._live_submitted = 0  # live streams (a job's segments are not)
        self._talked_live_audio_s = 0.0  # at speed 1, of live streams
        self._talked_by_language: dict[str, list[float]] = {}  # language -> [chars, audio_s]

    def on_forget(self, forget: Callable[[StreamRecord], None]) -> None:
        """`forget(record)` is called when a stream's work ends, however it ends."""
        self._forget.append(forget)

    def on_unparked(self, unparked: Callable[[StreamRecord], None]) -> None:
        """`unparked(record)` is called when a parked stream's reader drained its channel."""
        self._unparked.append(unparked)

    # Queries.

    def __len__(self) -> int:
        """Streams with work left."""
        return len(self._records)

    def __contains__(self, stream_id: str) -> bool:
        return stream_id in self._streams

    def record(self, stream_id: str) -> StreamRecord | None:
        return self._records.get(stream_id)

    @property
    def records(self) -> dict[str, StreamRecord]:
        """Streams with work left, by arrival (read only)."""
        return self._records

    def stream(self, stream_id: str) -> Stream | None:
        entry = self._streams.get(stream_id)
        return None if entry is None else entry[0]

    def stream_ids(self) -> list[str]:
        """Every non-terminal stream (draining ones included)."""
        return list(self._streams)

    def is_live(self, record: StreamRecord) -> bool:
        return self._records.get(record.stream.id) is record

    def load(self) -> Load:
        return Load(len(self._records) - len(self._idle))

    @property
    def mean_stream_audio_s(self) -> float:
        """Audio talked per live stream submitted, at speed 1 (inf before any was talked);
        a job's long segments are no guide to what a live request owes."""
        if not self._talked_live_audio_s:
            return math.inf
        return self._talked_live_audio_s / self._live_submitted

    def loads(
        self, start_chunk_audio_s: float, cost: Callable[[str], float] | None = None
    ) -> list[StreamLoad]:
        """What each stream with work left still owes, for admission: its audio left
        (the text's estimated length less what was sent, from the audio per character
        talked in its language; inf while its text is open), and while it starts,
        `start_chunk_audio_s` per start-phase chunk still to send (one while its chunks
        are sent and the talker's next step is still owed). `cost(voice_id)`: its voice's
        cost against the reference voice's (StreamLoad.cost; None: 1).

        A chunk carries no more audio than its stream's text: with a closed text, the
        start chunk's audio is at most the text's estimated audio. A whole-segment
        chunking (Kokoro's 4096 frames, 102 s a chunk) otherwise made every stream owe
        >= 102 s, and a burst of six requests on Kokoro alone was refused with a 36 s
        Retry-After for streams that ended in 2 s."""
        per_char = {
            language: audio_s / chars
            for language, (chars, audio_s) in self._talked_by_language.items()
            if chars
        }
        starting, chunks = self._starting, self._start_phase_chunks
        loads = []
        for stream_id, record in self._records.items():
            job_rate = record.job_rate
            if job_rate == 0:  # a best-effort job: takes only what is left, counts nothing
                continue
            stream = record.stream
            per_char_s = per_char.get(stream.voice.language, _DEFAULT_AUDIO_S_PER_CHAR)
            text_s = record.text_chars * per_char_s / stream.speed
            chunk_s = (
                min(start_chunk_audio_s, text_s) if record.text_closed else start_chunk_audio_s
            )
            owed_s = max(text_s - stream.stats.audio_s, chunk_s) if record.text_closed else math.inf
            left = 0
            if stream_id in starting and not record.waits_for_text:
                left = max(1, chunks - stream.stats.chunks)
            if job_rate is not None:  # a job with a deadline: the rate promised to it
                loads.append(StreamLoad(owed_s, 0.0, units=job_rate))
                continue
            stream_cost = 1.0 if cost is None else cost(stream.voice.id)
            loads.append(StreamLoad(owed_s, left * chunk_s, cost=stream_cost))
        return loads

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
        """Where the table holds this stream (empty once it is finished)."""
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
        if stream_id in self._starting:
            places.append("starting")
        if any(event_id == stream_id for event_id, _ in self._inbox):
            places.append("inbox")
        if stream_id in self.scheduler:
            places.append("scheduler")
        return places

    # Streams.

    def add_stream(
        self,
        voice: Voice,
        *,
        speed: float,
        now_s: float,
        job_pace: tuple[float, float] | None = None,
    ) -> StreamRecord:
        """A newly admitted stream, with no text yet. A job's stream has `job_pace`, its
        virtual player's (horizon_s, rate) (scheduling/jobs.py), and no start phase."""
        self._submitted += 1
        stream_id = uuid.uuid4().hex
        sender, receiver = audio_channel(
            stream_id, voice.sample_rate_hz, self._max_pending_audio_s, self.reader_event
        )
        stream = Stream(stream_id, voice, speed=speed, submitted_at_s=now_s, audio=receiver)
        self._streams[stream_id] = (stream, sender)
        record = self._records[stream_id] = StreamRecord(
            stream=stream,
            sender=sender,
            tag=self._submitted,
            order=self._submitted,
            segmenter=self._new_segmenter(language=voice.language),
            aligner=StreamAligner(
                stream.alignment,
                voice.samples_per_frame / voice.sample_rate_hz,
                speed,
                lambda: stream.stats.audio_s,
            ),
        )
        if job_pace is not None:
            record.job_rate = job_pace[1]
            stream.stats.job = True
            self.scheduler.admit(stream_id, now_s, horizon_s=job_pace[0], rate=job_pace[1])
            return record
        self._live_submitted += 1
        if self._start_phase_chunks:
            self._starting[stream_id] = None
        self.scheduler.admit(stream_id, now_s)  # its first-chunk deadline counts from now
        self._events.stream_started(stream_id)
        return record

    def talked_segment(
        self, chars: int, audio_s_at_speed_1: float, language: str = "", *, job: bool = False
    ) -> None:
        """A segment of `chars` characters was talked in `language`: the owed-work
        estimate learns (a Japanese character is ~4x an English one's audio), from a
        job's segments too; the mean live stream only from live streams'."""
        if not job:
            self._talked_live_audio_s += audio_s_at_speed_1
        entry = self._talked_by_language.setdefault(language, [0, 0.0])
        entry[0] += chars
        entry[1] += audio_s_at_speed_1

    def text_added(self, record: StreamRecord) -> None:
        """The stream has text to talk: it has work again."""
        self._idle.discard(record.stream.id)

    def chunk_sent(self, record: StreamRecord) -> None:
        """The stream sent a chunk: a live-text stream may now wait for its client's text
        (idle), and it may have left its start phase."""
        stats = record.stream.stats
        if stats.chunks == 1 and stats.ttfa_s is not None and record.text_closed and not stats.job:
            # a whole text's start (a live text's first audio waits on its client too; a
            # job's segment waits on the capacity live listeners leave)
            self.first_audio.record(stats.ttfa_s)
        waits = record.waits_for_text
        if waits:
            self._idle.add(record.stream.id)
        self._end_start(record, waits)

    def frames_made(self, record: StreamRecord) -> None:
        """The talker made frames for the stream: it may have left its start phase."""
        self._end_start(record, False)

    def _end_start(self, record: StreamRecord, waits: bool) -> None:
        """A stream leaves its start phase once it sent `start_phase_chunks` chunks and
        its talker is past its start: the frames of its first steady chunk are made (the
        talker's second step for a Piper voice, the work a start owes up front, which
        waits on the talker's lane behind other streams' steps), or all its text; a
        live-text stream that sent all it had leaves it at once."""
        stream_id = record.stream.id
        if stream_id not in self._starting:
            return
        if not waits:
            if record.stream.stats.chunks < self._start_phase_chunks:
                return
            if not record.talked_all and record.frames.queued_frames < self._start_ahead_frames:
                return
        del self._starting[stream_id]
        self._start_freed()

    # Endings.

    def finish(self, record: StreamRecord) -> None:
        """Its audio is all sent: the stream drains (done once its reader read it all)."""
        self._drop(record)
        record.stream.state = StreamState.DRAINING
        record.sender.close()

    def fail(self, record: StreamRecord, error: BaseException) -> None:
        """A backend call failed for this stream: end it with the error."""
        if not self.is_live(record):
            return
        stream = record.stream
        log.warning("stream %s failed: %r", stream.id, error)
        self._drop(record)
        stream.state = StreamState.FAILED
        record.sender.fail(error)
        self._finalize(stream)

    def fail_all(self, error: BaseException) -> None:
        for record in list(self._records.values()):
            self.fail(record, error)

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
        self._inbox.clear()

    # The audio channel's reader.

    def reader_event(self, stream_id: str, event: ReaderEvent) -> None:
        """What a reader reports. Read all: a draining stream is done, at once (it holds no
        stage work). Gone or unparked: queued for the next step boundary (`apply_inbox`),
        where the stages' indexes change."""
        if event is ReaderEvent.READ_ALL:
            stream = self.stream(stream_id)
            if stream is not None and stream.state is StreamState.DRAINING:
                stream.state = StreamState.DONE
                self._finalize(stream)
            return
        self._inbox.append((stream_id, event))
        self._wake()

    def apply_inbox(self) -> None:
        """Apply the reader events waiting (a stage driver calls it before it plans)."""
        inbox = self._inbox
        while inbox:
            stream_id, event = inbox.popleft()
            if event is ReaderEvent.GONE:
                self.cancel(stream_id)
            elif (record := self._records.get(stream_id)) is not None:
                for unparked in self._unparked:
                    unparked(record)

    # Internals.

    def _drop(self, record: StreamRecord) -> None:
        stream_id = record.stream.id
        del self._records[stream_id]
        self._starting.pop(stream_id, None)
        self._idle.discard(stream_id)
        for forget in self._forget:
            forget(record)
        record.text.clear()
        record.frames.clear()
        record.chunk = None
        self.scheduler.forget(stream_id)
        self._start_freed()  # it owes no more work: admission may grant a waiter

    def _finalize(self, stream: Stream) -> None:
        stats = stream.stats
        stats.finished_at_s = self._clock()
        self._streams.pop(stream.id, None)
        # one line per live stream; a job's segments are its runner's (one line per job)
        log.log(
            logging.DEBUG if stats.job else logging.INFO,
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
        if not stats.job:
            self._events.stream_finished(stats, stream.state)
