"""The stream book: the engine's state, as the stream table and the two stage cores.

- `table` (pipeline/table.py): the live streams, their records, their endings, and the
  inbox of what their readers report;
- `talker` (pipeline/talker_core.py): the talker's queue and plans;
- `vocoder` (pipeline/vocoder_core.py): the vocoder's ready and ahead sets and plans;
- `load()` (pipeline/load.py): the one measure of load their decisions read.

The book adds the transitions that concern every part at once: a stream and its text
arrive, a client acks its playback, a stream is cancelled. No asyncio here: the wakes are
plain callables, so the book is driven by a virtual clock as well (the simulator).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from pipeline.admission import start_phase_chunks
from pipeline.backend import AbortHandle, Backend, Voice
from pipeline.config import AloneConfig, TalkerConfig, TextConfig, VocoderConfig
from pipeline.events import EngineEvents, EngineStats
from pipeline.load import ALWAYS_URGENT, Load, UrgentSlack
from pipeline.records import StreamRecord
from pipeline.stream import Stream, StreamState
from pipeline.table import StreamTable
from pipeline.talker_core import TalkerCore, talker_order
from pipeline.text import Segmenter, segment_options
from pipeline.vocoder_core import VocoderCore
from scheduling import (
    AdmissionConfig,
    ChunkingConfig,
    ChunkPlanner,
    PlaybackScheduler,
    SchedulingConfig,
    StreamLoad,
    TalkerOrderConfig,
)


@dataclass(frozen=True)
class Wakes:
    """How the book tells a stage it has new work (an asyncio.Event's `set`, say)."""

    talker: Callable[[], None]
    vocoder: Callable[[], None]
    # a start-phase slot freed (a stream left its start phase or owes no more work):
    # admission's queue may go on
    start: Callable[[], None] = lambda: None


class StreamBook:
    """See the module doc. Built by the Engine (and the simulator's replica)."""

    def __init__(
        self,
        *,
        scheduler: PlaybackScheduler,
        planner: ChunkPlanner,
        order: TalkerOrderConfig,
        segmenter: Callable[..., Segmenter],  # called with language=the voice's
        max_pending_audio_s: float,
        clock: Callable[[], float],
        events: EngineEvents,
        wakes: Wakes,
        start_phase_chunks: int = 0,
        vocoder_workers: int = 1,
        work_ahead: bool = True,
        even_tail: bool = True,
        yield_slack_s: float = 0.0,
        prepares: bool = False,
        urgent: UrgentSlack = ALWAYS_URGENT,
        new_abort: Callable[[], AbortHandle] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.planner = planner

        def wake_both() -> None:
            wakes.talker()
            wakes.vocoder()

        self.table = StreamTable(
            scheduler=scheduler,
            segmenter=segmenter,
            max_pending_audio_s=max_pending_audio_s,
            clock=clock,
            events=events,
            wake=wake_both,
            start_phase_chunks=start_phase_chunks,
            # the frames a steady chunk needs, its lookahead included
            start_ahead_frames=planner.config.chunk_frames + planner.config.right_context_frames,
            start_freed=wakes.start,
        )
        self.vocoder = VocoderCore(
            self.table,
            planner,
            left_context_frames=planner.config.left_context_frames,
            events=events,
            wake=wakes.vocoder,
            workers=vocoder_workers,
            work_ahead=work_ahead,
            even_tail=even_tail,
            yield_slack_s=yield_slack_s,
            urgent=urgent,
            new_abort=new_abort,
        )
        self.talker = TalkerCore(
            self.table,
            self.vocoder,
            order,
            first_chunk_s=order.first_chunk_s,
            events=events,
            wake=wakes.talker,
            prepares=prepares,
            urgent=urgent,
        )
        self.vocoder.talker = self.talker

    # Queries.

    def __len__(self) -> int:
        """Streams with work left."""
        return len(self.table)

    def record(self, stream_id: str) -> StreamRecord | None:
        return self.table.record(stream_id)

    def stream(self, stream_id: str) -> Stream | None:
        return self.table.stream(stream_id)

    def stream_ids(self) -> list[str]:
        return self.table.stream_ids()

    def load(self) -> Load:
        return self.table.load()

    @property
    def mean_stream_audio_s(self) -> float:
        return self.table.mean_stream_audio_s

    def loads(
        self, start_chunk_audio_s: float, cost: Callable[[str], float] | None = None
    ) -> list[StreamLoad]:
        return self.table.loads(start_chunk_audio_s, cost)

    def stats(self, capacity_audio_s_per_s: float) -> EngineStats:
        return self.table.stats(capacity_audio_s_per_s)

    def traces(self, stream_id: str) -> list[str]:
        """Where the book still holds this stream (empty once it is finished)."""
        return (
            self.table.traces(stream_id)
            + self.talker.traces(stream_id)
            + self.vocoder.traces(stream_id)
        )

    # Transitions that concern every part.

    def add_stream(
        self,
        voice: Voice,
        *,
        speed: float,
        now_s: float,
        job_pace: tuple[float, float] | None = None,
    ) -> Stream:
        """A newly admitted stream, with no text yet (a job's: with its virtual player's
        (horizon_s, rate))."""
        record = self.table.add_stream(voice, speed=speed, now_s=now_s, job_pace=job_pace)
        return record.stream

    def pace_job(self, stream_id: str, horizon_s: float, rate: float, now_s: float) -> None:
        """A job's stream gets a new virtual player (a listener came or went)."""
        record = self.table.record(stream_id)
        if record is not None and record.job_rate is not None:
            record.job_rate = rate
            self.scheduler.pace(stream_id, horizon_s, rate, now_s)
            self.talker.playback_moved(record)

    def add_text(self, stream_id: str, text: str, *, final: bool, flush: bool = False) -> None:
        """More text for a live stream; `flush` cuts there: the text so far is spoken without
        waiting for its sentence to end (more may follow), `final` ends the text."""
        record = self.table.record(stream_id)
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
            self.table.text_added(record)
        self.talker.text_added(record)
        if final:
            if record.talked_all:
                record.aligner.finish(record.frames.produced_frames)
                if record.stream.state is StreamState.TALKING:
                    record.stream.state = StreamState.VOCODING
            self.vocoder.frames_changed(record)  # the planner learns whether it may end
            self.vocoder.finish_if_done(record)

    def ack_playback(self, stream_id: str, played_s: float, now_s: float) -> None:
        """Client truth about its playback; ignored before the stream's first audio."""
        record = self.table.record(stream_id)
        if record is not None and self.scheduler.horizon_s(stream_id) is not None:
            self.scheduler.ack_playback(stream_id, played_s, now_s)
            self.talker.playback_moved(record)

    def cancel(self, stream_id: str) -> None:
        """End a stream now (caller, client gone, engine stop); frees every trace."""
        self.table.cancel(stream_id)

    def cancel_all(self) -> None:
        self.table.cancel_all()

    def fail_all(self, error: BaseException) -> None:
        self.table.fail_all(error)


def build_book(
    *,
    scheduling: SchedulingConfig,
    chunking: ChunkingConfig,
    admission: AdmissionConfig,
    talker: TalkerConfig,
    text: TextConfig,
    vocoder: VocoderConfig,
    alone: AloneConfig,
    backend: Backend,
    max_pending_audio_s: float,
    clock: Callable[[], float],
    events: EngineEvents,
    wakes: Wakes,
) -> StreamBook:
    """The book the engine runs over `backend`, from its configuration: the engine's and
    the simulator's one construction (so the simulator decides with the same settings)."""
    capabilities = backend.capabilities
    return StreamBook(
        scheduler=PlaybackScheduler(scheduling),
        planner=ChunkPlanner(chunking),
        order=talker_order(talker, scheduling),
        segmenter=partial(Segmenter, **segment_options(text)),
        max_pending_audio_s=max_pending_audio_s,
        clock=clock,
        events=events,
        wakes=wakes,
        # tracked where admission counts a start's extra cost
        start_phase_chunks=start_phase_chunks(admission),
        vocoder_workers=vocoder_workers(vocoder, backend),
        work_ahead=alone.work_ahead,
        even_tail=alone.even_tail,
        yield_slack_s=vocoder.yield_slack_s,
        prepares=capabilities.prepares_segments and alone.prepare_next,
        urgent=UrgentSlack(talker.urgent_slack_s, alone.urgent_slack_s),
        new_abort=backend.vocode_abort if capabilities.aborts_vocode else None,
    )


def vocoder_workers(vocoder: VocoderConfig, backend: Backend) -> int:
    """Vocoder workers: `vocoder.workers` where the backend's vocode calls may overlap."""
    return vocoder.workers if backend.capabilities.concurrent_vocode_calls else 1
