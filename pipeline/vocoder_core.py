"""The vocoder's decisions as plain code: which chunks the next vocode call decodes.

No asyncio, no threads: `schedule(now_s)` returns the next call as plain data (a
`VocodePlan`: the chunks PlaybackScheduler selects, at most K) or None, the driver runs
`backend.vocode(plan.items, abort=plan.abort)`, and `update(plan, pcms, now_s)` applies
what came back. The engine's driver (pipeline/vocoder.py, one loop per worker) and the
simulator's (benchmarks/sim_replica.py) only call these.

The core keeps two sets incrementally, so that no turn scans every stream:

- ready: streams whose next chunk is planned, not empty and not parked, in the order
  they became ready, less those a worker is decoding. Records whose frames or state
  changed are marked dirty and re-planned at the start of the next `schedule`.
- ahead (more than one worker): streams whose chunk a worker is decoding and whose NEXT
  chunk is planned, once their first chunk was sent (that one decodes alone: TTFA), for
  a stream alone (pipeline/load.py), and not while its talker call or preparation runs
  (the talker then has the other core, and its frames are what the stream needs next).
  A worker takes one only when no stream is ready (work-conserving). A stream's chunks
  leave strictly in order: one decoded before an earlier one is held on its record
  until that one is emitted. Once its text is all talked, its last frames are cut evenly
  over the workers (`alone.even_tail`), within the ramp already where its player has
  audio enough for those chunks to decode in time (at the rate the latest vocode call
  took per frame): a short text's rest decodes on every worker at once.

Yielding to a first audio (`vocoder.yield_slack_s`, more than one worker): while a
talker call or a vocode call that makes some stream's first audio runs, a worker whose
selection is all streams with that much audio buffered takes no turn; it is woken when
the last such call ends.
"""

from __future__ import annotations

from collections.abc import Callable, KeysView
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.backend import AbortHandle, VocodeItem
from pipeline.errors import BackendError
from pipeline.events import EngineEvents
from pipeline.load import ALWAYS_URGENT, Load, UrgentSlack
from pipeline.records import InFlight, StreamRecord
from pipeline.table import StreamTable
from scheduling import Chunk, ChunkPlanner


@dataclass(slots=True)
class VocodePlan:
    """One vocode call: `items[i]` decodes `batch[i]`'s chunk."""

    stream_ids: list[str]
    batch: list[tuple[StreamRecord, Chunk]]
    items: list[VocodeItem]
    abort: AbortHandle | None  # ends the call early (one stream's call, where possible)
    first_audio: bool  # it makes some stream's first audio
    started_s: float


class VocoderCore:
    """See the module doc."""

    def __init__(
        self,
        table: StreamTable,
        planner: ChunkPlanner,
        *,
        left_context_frames: int,
        events: EngineEvents,
        wake: Callable[[], None],
        workers: int = 1,
        work_ahead: bool = True,
        even_tail: bool = True,
        yield_slack_s: float = 0.0,
        urgent: UrgentSlack = ALWAYS_URGENT,
        new_abort: Callable[[], AbortHandle] | None = None,
    ) -> None:
        """`workers`: vocode calls that may run at once; `work_ahead`: a stream alone
        may have that many chunks in flight (see the module doc). `urgent`: a stream whose
        player has less audio ahead than its limit (or none yet) is urgent to the planner,
        whose chunk then waits for no lookahead.
        `new_abort`: the backend's `vocode_abort`, where it can end a call early."""
        self._table = table
        self._scheduler = table.scheduler
        self.planner = planner
        self._left_context_frames = left_context_frames
        self._events = events
        self._wake = wake
        self._workers = max(1, workers)
        self._max_in_flight = self._workers if work_ahead else 1
        self._yield_slack_s = yield_slack_s if self._workers > 1 else 0.0
        # urgency only changes a plan where chunks have lookahead: no lookup per plan otherwise
        self._cuts_short = planner.config.right_context_frames > 0
        self._urgent = urgent
        self._new_abort = new_abort
        self.talker: TalkerSide = _NoTalker()
        self._dirty: dict[str, StreamRecord] = {}  # chunk plan out of date
        self._ready: dict[str, None] = {}  # a non-empty chunk planned, not parked
        self._vocoding: set[str] = set()  # a worker decodes their chunk
        self._ahead: dict[str, None] = {}  # in _vocoding, next chunk planned
        self._turns = 0  # vocode calls running now
        self.first_audio_work = 0  # talker or vocode calls making a first audio, running
        self._yielded = False  # a worker waits for them to end
        self._even_tail = even_tail
        # seconds the latest vocode call took per frame it emitted (0: none yet): how
        # large a chunk a player's buffered audio covers (the even tail within the ramp)
        self._s_per_frame = 0.0
        self.turns = 0  # vocode calls whose outcome was applied
        self.yields = 0  # schedules that held a worker back for a first audio
        self.ahead_turns = 0  # plans of a chunk beside one in flight (work-ahead)
        table.on_forget(self._forget)
        table.on_unparked(self.frames_changed)

    # Queries.

    @property
    def ready_ids(self) -> KeysView[str] | list[str]:
        """Streams with a non-empty chunk planned (as of the last refresh) whose chunk no
        worker is decoding."""
        if not self._vocoding:
            return self._ready.keys()
        vocoding = self._vocoding
        return [stream_id for stream_id in self._ready if stream_id not in vocoding]

    def ahead_ids(self, load: Load) -> KeysView[str] | list[str]:
        """Streams whose next chunk may be decoded beside the one in flight (module doc)."""
        if not self._work_ahead(load) or not self._ahead:
            return {}.keys()
        records = self._table.records
        return [stream_id for stream_id in self._ahead if not records[stream_id].talking_now]

    def _work_ahead(self, load: Load) -> bool:
        return self._max_in_flight > 1 and load.alone

    def idle(self, load: Load, pace_on_full_workers: bool) -> bool:
        """The vocoder would leave a core idle: no chunk is ready that no worker took,
        and, where the talker paces on full workers, a worker is free or the stream is
        alone (its talker and vocoder then run side by side: all its work is due)."""
        if len(self._ready) != len(self._vocoding):
            return False
        return not pace_on_full_workers or self._turns < self._workers or load.alone

    @property
    def turns_running(self) -> int:
        return self._turns

    def traces(self, stream_id: str) -> list[str]:
        places = [
            name
            for name, index in (
                ("dirty", self._dirty),
                ("ready", self._ready),
                ("vocoding", self._vocoding),
                ("ahead", self._ahead),
            )
            if stream_id in index
        ]
        if stream_id in self.planner:
            places.append("planner")
        return places

    # The plan.

    def refresh(self, load: Load, now_s: float) -> None:
        """Re-plan the dirty records: the ready set is then up to date. Empty (terminal)
        chunks carry no audio and are committed here, without a call."""
        dirty, vocoding, ready = self._dirty, self._vocoding, self._ready
        while dirty:
            stream_id, record = dirty.popitem()
            if stream_id in vocoding:
                if self._work_ahead(load):
                    self._plan_ahead(record, load, now_s)
                continue  # otherwise re-planned once its chunk is committed
            chunk = record.chunk = self._plan(record, load, now_s)
            if chunk is None or record.sender.parked:
                ready.pop(stream_id, None)
            elif chunk.stop == chunk.start:  # empty
                ready.pop(stream_id, None)
                self._commit(record, chunk)
            else:
                ready[stream_id] = None
        self.talker.vocoder_progressed()  # it may have nothing waiting now

    def schedule(self, now_s: float) -> VocodePlan | None:
        """The next vocode call, or None (nothing to decode, or this worker yields)."""
        table = self._table
        table.apply_inbox()
        load = table.load()
        self.refresh(load, now_s)
        select = self._scheduler.select
        # every stream was admitted at submit
        if ready := self.ready_ids:
            selected = select(now_s, ready, all_admitted=True)
        elif ahead := self.ahead_ids(load):
            selected = select(now_s, ahead, all_admitted=True)
            self.ahead_turns += bool(selected)
        else:
            return None
        if not selected:  # fifo: the streams in its window have nothing ready
            return None
        if self._yield_slack_s and self.first_audio_work and self._buffered(selected, now_s):
            self.yields += 1
            self._yielded = True  # woken when the first-audio work ends
            return None
        self._turns += 1
        batch: list[tuple[StreamRecord, Chunk]] = []
        items: list[VocodeItem] = []
        first = False
        for stream_id in selected:
            record = table.records[stream_id]
            chunk = record.chunk
            assert chunk is not None and chunk.stop != chunk.start
            segment = record.frames.segment(chunk.segment)
            assert segment is not None, chunk
            first = first or record.stream.stats.chunks == 0
            self._take(record, chunk, load, now_s)
            batch.append((record, chunk))
            context_start = chunk.context_start
            # positional: voice, frames, emit_offset_frames, emit_frames
            items.append(
                VocodeItem(
                    record.stream.voice.id,
                    segment.frames(context_start, chunk.context_stop),
                    chunk.start - context_start,
                    chunk.stop - chunk.start,
                )
            )
        abort = None
        if self._new_abort is not None and len(batch) == 1:
            # a call for one stream ends early when the stream ends
            abort = batch[0][0].in_flight[-1].abort = self._new_abort()
        if first:
            self.first_audio_started()
        self.talker.vocoder_progressed()  # it may have been the last chunk waiting
        self._events.vocoder_selection(selected)
        return VocodePlan(list(selected), batch, items, abort, first, now_s)

    def _buffered(self, selected: list[str], now_s: float) -> bool:
        """Every selected stream's player has `yield_slack_s` of audio or more ahead."""
        slack_s = self._scheduler.slack_s
        for stream_id in selected:
            slack = slack_s(stream_id, now_s)
            if slack is None or slack < self._yield_slack_s:
                return False
        return True

    def _take(self, record: StreamRecord, chunk: Chunk, load: Load, now_s: float) -> None:
        """A worker takes the stream's planned chunk: in flight until emitted."""
        stream_id = record.stream.id
        self.planner.take(stream_id, chunk)
        record.in_flight.append(InFlight(chunk, taken_at_s=now_s))
        record.chunk = None
        self._vocoding.add(stream_id)
        self._ahead.pop(stream_id, None)
        if self._work_ahead(load):
            self._mark_dirty(record)  # its next chunk may be decoded beside this one

    def _plan_ahead(self, record: StreamRecord, load: Load, now_s: float) -> None:
        """A stream with chunks in flight: plan the chunk after them, for `ahead_ids`."""
        chunk = None
        if (
            len(record.in_flight) < self._max_in_flight
            and not record.sender.parked
            # not before its first audio: the first chunk gets a core to itself (TTFA)
            and record.stream.stats.chunks > 0
        ):
            chunk = self._plan(record, load, now_s)
        record.chunk = chunk
        if chunk is None or chunk.empty:  # an empty terminal waits for the ones in flight
            self._ahead.pop(record.stream.id, None)
        else:
            self._ahead[record.stream.id] = None

    def _plan(self, record: StreamRecord, load: Load, now_s: float) -> Chunk | None:
        frames = record.frames
        stream_id = record.stream.id
        if record.in_flight:  # the planner plans after the chunks in flight
            segment = frames.segment(self.planner.planning_segment(stream_id))
        else:
            segment = frames.current
        if segment is None:
            return None
        done = segment.done
        stream_done = done and record.talked_all and frames.is_last(segment)
        # a lone stream's last frames are cut evenly over the workers that decode them
        tail = stream_done and self._even_tail and self._work_ahead(load)
        slack_s = None
        if tail or self._cuts_short:
            slack_s = self._scheduler.slack_s(stream_id, now_s)
        split, early_frames, busy_frames = 1, 0, 0
        if tail:
            split = self._max_in_flight
            if slack_s is not None and self._s_per_frame > 0.0:
                # the chunks the player's audio covers, at the latest call's pace (a
                # best-effort job's player never comes due: every frame there is)
                early_frames = int(min(slack_s / self._s_per_frame, segment.available_frames))
                busy_frames = self._busy_frames(record, now_s)
        urgent = self._cuts_short and (slack_s is None or slack_s < self._urgent.limit_s(load))
        return self.planner.next_chunk(
            stream_id, segment.available_frames, done, stream_done, split, urgent, early_frames,
            busy_frames,
        )  # fmt: skip

    def _busy_frames(self, record: StreamRecord, now_s: float) -> int:
        """The frames the stream's chunks in flight have left to decode, at the latest
        call's pace: the work its other workers still hold."""
        left_s = 0.0
        for entry in record.in_flight:
            if entry.pcm is None:
                elapsed_s = now_s - entry.taken_at_s
                left_s += max(0.0, entry.chunk.frames * self._s_per_frame - elapsed_s)
        return int(left_s / self._s_per_frame)

    # The outcome.

    def update(self, plan: VocodePlan, pcms: list[np.ndarray] | Exception, now_s: float) -> float:
        """Apply a vocode call's outcome (its PCM per item, or the error it raised); the
        audio it sent (seconds)."""
        table = self._table
        audio_s = 0.0
        try:
            if not isinstance(pcms, Exception) and len(pcms) != len(plan.batch):
                pcms = BackendError(
                    f"vocode returned {len(pcms)} results for {len(plan.batch)} items"
                )
            if isinstance(pcms, Exception):
                for record, _ in plan.batch:
                    table.fail(record, pcms)
                return 0.0
            float32 = np.float32
            for (record, chunk), item, pcm in zip(plan.batch, plan.items, pcms, strict=True):
                if not table.is_live(record):
                    continue  # cancelled while the vocoder ran
                voice = record.stream.voice
                if type(pcm) is np.ndarray and pcm.dtype == float32 and pcm.ndim == 1:
                    samples = pcm
                else:
                    samples = np.asarray(pcm, dtype=float32).reshape(-1)
                if samples.size != item.emit_frames * voice.samples_per_frame:
                    error = BackendError(
                        f"vocode returned {samples.size} samples for {item.emit_frames} frames"
                    )
                    table.fail(record, error)
                    continue
                self.emit(record, chunk, samples, now_s)
                audio_s += samples.size / voice.sample_rate_hz
            emitted_frames = sum(item.emit_frames for item in plan.items)
            if emitted_frames:
                self._s_per_frame = (now_s - plan.started_s) / emitted_frames
            self.turns += 1
            return audio_s
        finally:
            if plan.first_audio:
                self.first_audio_ended()
            self._turns -= 1
            self.talker.vocoder_progressed()  # a worker is free

    def emit(self, record: StreamRecord, chunk: Chunk, pcm: np.ndarray, at_s: float) -> None:
        """One taken chunk's PCM. Sent at once when every chunk taken before it is sent;
        otherwise held until they are, then sent after them."""
        in_flight = record.in_flight
        for entry in in_flight:
            if entry.chunk is chunk:
                entry.pcm, entry.emitted_at_s = pcm, at_s
                break
        else:
            raise ValueError(f"emit of a chunk not in flight for {record.stream.id}: {chunk}")
        while in_flight and in_flight[0].pcm is not None and self._table.is_live(record):
            entry = in_flight.popleft()
            assert entry.pcm is not None
            # a held chunk leaves with the one it waited for
            self._send(record, entry.chunk, entry.pcm, max(entry.emitted_at_s, at_s))

    def _send(self, record: StreamRecord, chunk: Chunk, pcm: np.ndarray, at_s: float) -> None:
        """A chunk's PCM, in order: account for it, send it, commit the chunk."""
        stream = record.stream
        stream_id = stream.id
        stats = stream.stats
        scheduler = self._scheduler
        horizon_s = scheduler.horizon_s(stream_id)
        # a job's segment keeps its own figures; the live ones are live listeners' only
        if horizon_s is not None and at_s > horizon_s:
            stall_s = at_s - horizon_s
            stats.stalls += 1
            stats.stall_s += stall_s
            if not stats.job:
                self._events.stall(stream_id, stall_s)
        scheduler.record_audio(stream_id, pcm.size, stream.sample_rate_hz, at_s)
        first = stats.ttfa_s is None
        if first:
            stats.ttfa_s = at_s - stats.submitted_at_s
            if not stats.job:
                self._events.first_audio(stream_id, stats.ttfa_s)
        stats.audio_s += pcm.size / stream.sample_rate_hz
        stats.chunks += 1
        record.sender.send(pcm)
        self._commit(record, chunk)
        self.talker.audio_sent(record, first)
        if self._table.is_live(record):
            self._table.chunk_sent(record)

    def _commit(self, record: StreamRecord, chunk: Chunk) -> None:
        """The chunk left (or, empty, needed no decode): advance the planner, free frames."""
        stream_id = record.stream.id
        self.planner.commit(stream_id, chunk)
        # its chunk ahead, if any, is planned again from here (refresh)
        self._ahead.pop(stream_id, None)
        if not record.in_flight:
            self._vocoding.discard(stream_id)
        frames = record.frames
        frames.emitted(chunk.stop - chunk.start, free_before=chunk.stop - self._left_context_frames)
        record.chunk = None
        assert frames.queued_frames >= 0, "emitted more frames than the talker produced"
        if chunk.segment_end:
            frames.close_current()
        if chunk.final:
            assert record.talked_all and record.frames.segment_count == 0
            self._table.finish(record)
            return
        self._mark_dirty(record)
        if chunk.segment_end:
            self.finish_if_done(record)

    # What other transitions tell the vocoder.

    def frames_changed(self, record: StreamRecord) -> None:
        """The stream's frames or state changed: re-plan it at the next schedule."""
        self._dirty[record.stream.id] = record
        self._wake()

    def finish_if_done(self, record: StreamRecord) -> None:
        """A stream whose text is all talked and whose segments are all emitted is done."""
        if self._table.is_live(record) and record.talked_all and record.frames.segment_count == 0:
            self._table.finish(record)

    def talker_stepped(self, stream_ids: list[str]) -> None:
        """A talker call over these streams ended: a chunk ahead held back may go now."""
        if self._ahead and any(stream_id in self._ahead for stream_id in stream_ids):
            self._wake()

    def first_audio_started(self) -> None:
        self.first_audio_work += 1

    def first_audio_ended(self) -> None:
        self.first_audio_work -= 1
        if not self.first_audio_work and self._yielded:
            self._yielded = False
            self._wake()

    def _mark_dirty(self, record: StreamRecord) -> None:
        self._dirty[record.stream.id] = record
        self._wake()

    def _forget(self, record: StreamRecord) -> None:
        stream_id = record.stream.id
        self._dirty.pop(stream_id, None)
        self._ready.pop(stream_id, None)
        self._vocoding.discard(stream_id)
        self._ahead.pop(stream_id, None)
        for entry in record.in_flight:  # its decodes in flight are of no use now
            if entry.abort is not None and entry.pcm is None:
                entry.abort()
        record.in_flight.clear()
        self.planner.forget(stream_id)
        if self._max_in_flight > 1 and len(self._table) == 1:
            # the stream left is alone now: its next chunk may be decoded ahead
            for other in self._table.records.values():
                self._mark_dirty(other)
        self._wake()  # under fifo its slot is free now


class TalkerSide(Protocol):
    """What the vocoder core tells the talker core (pipeline/talker_core.py)."""

    def vocoder_progressed(self) -> None: ...

    def audio_sent(self, record: StreamRecord, first: bool) -> None: ...


class _NoTalker:
    """Until the book connects the talker core."""

    def vocoder_progressed(self) -> None:
        return None

    def audio_sent(self, record: StreamRecord, first: bool) -> None:
        return None
