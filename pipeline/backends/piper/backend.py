"""PiperBackend: Piper voices served as talker graphs and a vocoder graph (see graph_split).

The talker of a voice whose flow is cut off works in steps: the first step of a segment
runs the encoder (text encoder + duration predictor) over the whole segment once, so
prosody and durations are the whole sentence's, then every step runs the flow over the
next chunk of frames with `flow_context_frames` of context on each side (the flow is
non-causal; its context is trimmed) and returns that chunk. The first chunk of an urgent
segment (`TalkRequest.urgent`: its stream needs audio soon) is small
(`flow_first_chunk_frames`) so that the vocoder can start early; each next one is
FLOW_GROWTH times the one before, up to `flow_max_chunk_frames`. Any other segment starts
at `flow_max_chunk_frames`: most segments then run the flow once, with no context.

`prepare_segment` runs a segment's phonemiser and encoder ahead, on the backend's own
helper thread, while the talker steps the segment before it; `open_segment` for the same
text, voice and speed then takes that work instead of doing it again (waiting for it when
it is running). The engine asks for it only while few streams have work (a lone request:
its next sentence's encoder runs on the core its first chunks leave idle).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.backend import (
    AbortHandle,
    Backend,
    BackendCapabilities,
    SegmentTiming,
    TalkRequest,
    TalkStep,
    VocodeItem,
    Voice,
)
from pipeline.backends.piper.errors import UnknownPiperVoice
from pipeline.backends.piper.phonemes import text_to_ids, text_to_phoneme_ids
from pipeline.backends.piper.prepared import Prepared, PreparedSegments
from pipeline.backends.piper.sessions import LoadedVoice, VocodeAbort, load_voice
from pipeline.backends.piper.timing import segment_timing
from pipeline.backends.piper.vocoder_trim import TRIM_START, TRIM_STOP, trim_range
from pipeline.backends.piper.voices import (
    VoiceSpec,
    bundled_model_path,
    discover_voices,
    load_voice_spec,
)
from pipeline.config import PiperConfig

logger = logging.getLogger("playhead.piper")
# Each flow chunk of a segment is this many times the one before: a few steps per sentence
# (each step's context costs 2 x flow_context_frames of flow), yet each step is short
# beside the audio the chunks before it play for.
FLOW_GROWTH = 4


@dataclass(slots=True)
class PiperSegment:
    """One segment's talker state: its phoneme ids and scales; once the encoder ran, the
    flow's input and how far the flow got."""

    voice: str
    phoneme_ids: list[int]
    scales: tuple[float, float, float]
    prior: np.ndarray | None = None  # [1, channels, frames] z_p: the encoder's output
    mask: np.ndarray | None = None  # [1, 1, frames]
    position: int = 0  # frames returned so far
    next_chunk: int = 0  # frames the next flow step returns
    # for the segment's timing (pipeline/backends/piper/timing.py): its text, phonemes,
    # each id's phoneme, and once the encoder ran each id's frames (None: not known)
    text: str = ""
    phonemes: list[str] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    durations: np.ndarray | None = None
    timed: bool = False  # its timing was returned
    all_cores: bool = False  # its next step may use every core (TalkRequest.all_cores)


def _non_negative_or_none(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class PiperBackend(Backend):
    """The bundled voice (the default) plus every voice in `PiperConfig.voices_dir`.

    `noise_scale` / `noise_w` override every voice's config (0 makes the output
    deterministic; tests use it). `step` runs in the talker threads and `vocode` in the
    vocoder's: each stage has its own ONNX Runtime sessions per voice.
    """

    name = "piper"
    capabilities = BackendCapabilities(
        # a step works on its own segments' state through ONNX Runtime sessions (safe to
        # run from two threads); phonemising is serialised by a lock (espeak-ng is one
        # global instance)
        concurrent_talker_steps=True,
        # vocode runs the vocoder session, which two threads may run at once
        concurrent_vocode_calls=True,
        # the phonemiser and encoder of a stream's next segment, on a helper thread
        prepares_segments=True,
        # ONNX Runtime's terminate flag ends a running decode
        aborts_vocode=True,
    )

    def __init__(
        self,
        piper: PiperConfig | None = None,
        *,
        noise_scale: float | None = None,
        noise_w: float | None = None,
    ) -> None:
        piper = piper or PiperConfig()
        # keyword arguments override the config (tests pin noise to 0 this way)
        noise_scale = piper.noise_scale if noise_scale is None else noise_scale
        noise_w = piper.noise_w if noise_w is None else noise_w
        _non_negative_or_none("noise_scale", noise_scale)
        _non_negative_or_none("noise_w", noise_w)
        self._noise_scale = noise_scale
        self._noise_w = noise_w
        self._output_gain = float(piper.output_gain)
        self._flow_context = piper.flow_context_frames
        self._flow_first_chunk = piper.flow_first_chunk_frames
        self._flow_max_chunk = piper.flow_max_chunk_frames
        self._vocoder_trim = piper.vocoder_trim
        self._phonemize_lock = threading.Lock()
        # prepare_segment's work: (voice, text, speed) -> its phoneme ids and encoding
        self._prepared = PreparedSegments(self._prepare)
        self.prepared_used = 0  # segments opened with prepared work

        default_path = Path(piper.model_path) if piper.model_path else bundled_model_path()
        specs = [load_voice_spec(default_path)]
        if piper.voices_dir:
            specs.extend(discover_voices(piper.voices_dir))
        self._voices: dict[str, LoadedVoice] = {}
        for spec in specs:
            if spec.id in self._voices:
                logger.warning(
                    "voice %s in %s repeats a loaded voice id: skipped", spec.id, spec.model_path
                )
                continue
            self._voices[spec.id] = load_voice(spec, piper)
        self._default = specs[0].id
        default_voice = self._voices[self._default].voice
        self.sample_rate_hz = default_voice.sample_rate_hz
        self.samples_per_frame = default_voice.samples_per_frame

    # Backend protocol

    def voices(self) -> list[Voice]:
        return [loaded.voice for loaded in self._voices.values()]

    def default_voice(self) -> str:
        return self._default

    def open_segment(self, request: TalkRequest) -> PiperSegment:
        """Phonemise the segment (espeak-ng); the talker graphs run in `step`. A segment
        `prepare_segment` was asked for takes that work (waits for it if it runs)."""
        loaded = self._get(request.voice)
        scales = self.scales(request.voice, request.speed)
        # an urgent segment's first frames come from a small first flow step; any other's
        # flow runs over the whole segment at once (up to flow_max_chunk_frames): no
        # context at its seams, so fewer frames of flow in all
        first = self._flow_first_chunk if request.urgent else self._flow_max_chunk
        prepared = self._prepared.take(request)
        if prepared is not None:
            self.prepared_used += 1
            return PiperSegment(
                request.voice,
                prepared.phoneme_ids,
                scales,
                prior=prepared.prior,
                mask=prepared.mask,
                next_chunk=first,
                text=request.text,
                phonemes=prepared.phonemes,
                owners=prepared.owners,
                durations=prepared.durations,
                all_cores=request.all_cores,
            )
        with self._phonemize_lock:
            ids, phonemes, owners = text_to_phoneme_ids(loaded.spec, request.text)
        return PiperSegment(
            request.voice,
            ids,
            scales,
            next_chunk=first,
            text=request.text,
            phonemes=phonemes,
            owners=owners,
            all_cores=request.all_cores,
        )

    def prepare_segment(self, request: TalkRequest) -> Future[Prepared] | None:
        """Start `request`'s phonemiser and encoder on the helper thread and return at
        once: the future is done when the work is (None: it was already asked for).
        `open_segment` for the same text, voice and speed takes the result. Best effort:
        a failure here only means `open_segment` does the work itself."""
        return self._prepared.start(request)

    def drop_prepared(self) -> None:
        """Give up every prepared segment: those not started never run, a running one ends
        early (ONNX Runtime's terminate flag); `open_segment` then does the work itself. The
        engine calls it when the stream is no longer alone: the helper thread would take
        a core from the stage threads."""
        self._prepared.drop()

    @property
    def prepare_calls(self) -> int:
        """prepare_segment calls that started work (tests, benchmarks)."""
        return self._prepared.started

    def _prepare(self, request: TalkRequest, abort: VocodeAbort) -> Prepared:
        loaded = self._get(request.voice)
        scales = self.scales(request.voice, request.speed)
        with self._phonemize_lock:
            ids, phonemes, owners = text_to_phoneme_ids(loaded.spec, request.text)
        if not ids or loaded.flow is None:  # nothing to encode ahead: a one-call talker
            return Prepared(ids, None, None, phonemes, owners)
        prior, mask, durations = self._encode(loaded, ids, scales, run_options=abort.options)
        return Prepared(ids, prior, mask, phonemes, owners, durations)

    def step(self, segments: Sequence[PiperSegment]) -> list[TalkStep]:
        """The next chunk of each segment: float32 [frames, channels] (none for text with
        no phonemes). A voice whose flow is not cut off gives a whole segment per step.
        Segments run one after another."""
        return [self._step_one(segment) for segment in segments]

    def _step_one(self, segment: PiperSegment) -> TalkStep:
        loaded = self._get(segment.voice)
        if not segment.phoneme_ids:
            return TalkStep(np.zeros((0, loaded.channels), dtype=np.float32), done=True)
        if loaded.flow is None:
            frames, segment.durations = self._talk_whole(
                loaded, segment.phoneme_ids, segment.scales
            )
            return TalkStep(frames, done=True, timing=self._timing(segment))
        # the first step of a segment that has the machine to itself: every core
        wide = segment.all_cores and loaded.alone_encoder is not None
        segment.all_cores = False
        if segment.prior is None:
            segment.prior, segment.mask, segment.durations = self._encode(
                loaded, segment.phoneme_ids, segment.scales, wide=wide
            )
        total = segment.prior.shape[2]
        start = segment.position
        stop = min(total, start + max(segment.next_chunk, 1))
        if total - stop < self._flow_context:  # no sliver of a last chunk
            stop = total
        frames = self._flow(loaded, segment.prior, segment.mask, start, stop, wide=wide)
        segment.position = stop
        segment.next_chunk = min(FLOW_GROWTH * segment.next_chunk, self._flow_max_chunk)
        done = stop >= total
        timing = self._timing(segment)
        if done:
            segment.prior = segment.mask = None
            segment.phoneme_ids = []
        return TalkStep(frames, done, timing)

    @staticmethod
    def _timing(segment: PiperSegment) -> SegmentTiming | None:
        """The segment's timing on its first step with frames (None after that, or when
        the graph gives no durations); a failure here costs the timing, not the audio."""
        if segment.timed or segment.durations is None:
            return None
        segment.timed = True
        try:
            return segment_timing(segment.text, segment.phonemes, segment.owners, segment.durations)
        except Exception:
            logger.exception("timing a segment failed; its characters are spread evenly")
            return None

    def _encode(
        self,
        loaded: LoadedVoice,
        phoneme_ids: Sequence[int],
        scales: tuple[float, float, float],
        run_options: ort.RunOptions | None = None,
        *,
        wide: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The encoder over a whole segment: (z_p [1, channels, frames], mask [1, 1, frames],
        frames per phoneme id or None where the graph does not give them);
        `run_options`: the call's (its terminate flag ends it early); `wide`: on the
        session of `piper.alone_intra_op_threads` threads."""
        ids = np.asarray(phoneme_ids, dtype=np.int64)[np.newaxis, :]
        encoder = loaded.alone_encoder if wide and loaded.alone_encoder else loaded.encoder
        prior, mask, frame_count, *timing = encoder.run(
            None,
            {
                "input": ids,
                "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
                "scales": np.asarray(scales, dtype=np.float32),
            },
            run_options,
        )
        frames = int(frame_count[0])
        durations = timing[0].reshape(-1) if timing else None
        return prior[:, :, :frames], mask[:, :, :frames], durations

    def _flow(
        self,
        loaded: LoadedVoice,
        prior: np.ndarray,
        mask: np.ndarray,
        start: int,
        stop: int,
        *,
        wide: bool = False,
    ) -> np.ndarray:
        """The flow's frames [start, stop), run with `flow_context_frames` of context on
        each side (trimmed): float32 [frames, channels], C-contiguous; `wide`: on the
        session of `piper.alone_intra_op_threads` threads."""
        total = prior.shape[2]
        first = max(0, start - self._flow_context)
        last = min(total, stop + self._flow_context)
        flow = loaded.alone_flow if wide and loaded.alone_flow else loaded.flow
        assert flow is not None
        inputs = [i.name for i in flow.get_inputs()]
        (latent,) = flow.run(
            None, {inputs[0]: prior[:, :, first:last], inputs[1]: mask[:, :, first:last]}
        )
        return np.ascontiguousarray(latent[0, :, start - first : stop - first].T, dtype=np.float32)

    def close_segment(self, segment: PiperSegment) -> None:
        segment.phoneme_ids = []
        segment.prior = segment.mask = None

    def vocode_abort(self) -> VocodeAbort:
        """A handle that ends a `vocode` call it is passed to, from any thread: the call
        raises (ONNX Runtime's terminate flag; the session stays usable)."""
        return VocodeAbort()

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        """Items of one voice and equal length share one decoder call; where the voice's
        graph is trimmed (`vocoder_trim.py`, `piper.vocoder_trim`), its later stages decode
        only the union of those items' emitted frames plus their reach. `abort` (from
        `vocode_abort`): called,
        it ends the call early (the engine does when every stream of the call is gone)."""
        if abort is not None and not isinstance(abort, VocodeAbort):
            raise TypeError("abort must be a handle from this backend's vocode_abort")
        return self._vocode(items, None if abort is None else abort.options)

    def _vocode(
        self, items: Sequence[VocodeItem], run_options: ort.RunOptions | None
    ) -> list[np.ndarray]:
        pcm: list[np.ndarray | None] = [None] * len(items)
        groups: dict[tuple[str, int], list[int]] = {}
        for index, item in enumerate(items):
            loaded = self._get(item.voice)
            frames = np.asarray(item.frames)
            if frames.ndim != 2 or frames.shape[1] != loaded.channels:
                raise ValueError(
                    f"frames must be [frames, {loaded.channels}], got {list(frames.shape)}"
                )
            if item.emit_offset_frames < 0 or item.emit_frames < 0:
                raise ValueError("emit_offset_frames and emit_frames must be >= 0")
            emit_stop = item.emit_offset_frames + item.emit_frames
            if emit_stop > frames.shape[0]:
                raise ValueError(
                    f"emit range [{item.emit_offset_frames}, {emit_stop}) "
                    f"exceeds {frames.shape[0]} frames"
                )
            if item.emit_frames == 0:
                pcm[index] = np.zeros(0, dtype=np.float32)
                continue
            groups.setdefault((item.voice, frames.shape[0]), []).append(index)

        for (voice_id, length), indices in groups.items():
            loaded = self._voices[voice_id]
            batch = np.stack([np.asarray(items[i].frames, dtype=np.float32).T for i in indices])
            feed: dict[str, np.ndarray] = {loaded.latent_name: batch}
            first = 0  # the first frame the output covers
            trim = loaded.trim
            if trim is not None:
                # the later stages decode only the emitted frames and their reach
                emits = [(items[i].emit_offset_frames, items[i].emit_frames) for i in indices]
                first, last = trim_range(length, emits, trim, self._vocoder_trim)
                feed[TRIM_START] = np.array([first * trim.samples_per_frame], np.int64)
                feed[TRIM_STOP] = np.array([last * trim.samples_per_frame], np.int64)
            (audio,) = loaded.vocoder.run(None, feed, run_options)
            audio = audio.reshape(len(indices), -1)
            hop = loaded.spec.samples_per_frame
            for row, index in enumerate(indices):
                item = items[index]
                start = (item.emit_offset_frames - first) * hop
                piece = audio[row, start : start + item.emit_frames * hop] * self._output_gain
                pcm[index] = np.clip(piece, -1.0, 1.0).astype(np.float32, copy=False)
        return pcm  # type: ignore[return-value]  # every slot is filled above

    def close(self) -> None:
        self._prepared.close()
        self._voices.clear()

    # Helpers used by tests and benchmarks

    def voice_spec(self, voice_id: str) -> VoiceSpec:
        return self._get(voice_id).spec

    def scales(self, voice_id: str, speed: float = 1.0) -> tuple[float, float, float]:
        """(noise_scale, length_scale, noise_w) for one talker call; speed 2.0 halves durations."""
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        spec = self._get(voice_id).spec
        noise_scale = spec.noise_scale if self._noise_scale is None else self._noise_scale
        noise_w = spec.noise_w if self._noise_w is None else self._noise_w
        return noise_scale, spec.length_scale / speed, noise_w

    def phoneme_ids(self, voice_id: str, text: str) -> list[int]:
        return text_to_ids(self._get(voice_id).spec, text)

    def talk_ids(
        self, voice_id: str, phoneme_ids: Sequence[int], scales: tuple[float, float, float]
    ) -> np.ndarray:
        """The whole talker on given ids (the flow run once over every frame, no chunks):
        float32 [frames, channels], C-contiguous."""
        loaded = self._get(voice_id)
        if loaded.flow is not None:
            prior, mask, _ = self._encode(loaded, phoneme_ids, scales)
            inputs = [i.name for i in loaded.flow.get_inputs()]
            (latent,) = loaded.flow.run(None, {inputs[0]: prior, inputs[1]: mask})
            return np.ascontiguousarray(latent[0].T, dtype=np.float32)
        return self._talk_whole(loaded, phoneme_ids, scales)[0]

    @staticmethod
    def _talk_whole(
        loaded: LoadedVoice, phoneme_ids: Sequence[int], scales: tuple[float, float, float]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """A flow-less voice's one-graph talker: (frames [frames, channels], frames per
        phoneme id or None)."""
        ids = np.asarray(phoneme_ids, dtype=np.int64)[np.newaxis, :]
        latent, frame_count, *timing = loaded.encoder.run(
            None,
            {
                "input": ids,
                "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
                "scales": np.asarray(scales, dtype=np.float32),
            },
        )
        frames = int(frame_count[0])
        durations = timing[0].reshape(-1) if timing else None
        return np.ascontiguousarray(latent[0, :, :frames].T, dtype=np.float32), durations

    def _get(self, voice_id: str) -> LoadedVoice:
        try:
            return self._voices[voice_id]
        except KeyError:
            raise UnknownPiperVoice(
                f"unknown voice {voice_id!r}; available: {', '.join(self._voices)}"
            ) from None
