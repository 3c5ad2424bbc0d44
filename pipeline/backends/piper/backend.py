"""PiperBackend: Piper voices served as a talker graph and a vocoder graph (see graph_split)."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.backend import TalkRequest, TalkStep, VocodeItem, Voice
from pipeline.backends.piper.errors import UnknownPiperVoice, VoiceLoadError
from pipeline.backends.piper.graph_split import SplitGraphs, load_split
from pipeline.backends.piper.phonemes import text_to_ids
from pipeline.backends.piper.voices import (
    VoiceSpec,
    bundled_model_path,
    discover_voices,
    load_voice_spec,
)
from pipeline.config import PiperConfig, TalkerConfig, VocoderConfig

logger = logging.getLogger("playhead.piper")


@dataclass(slots=True)
class PiperSegment:
    """One segment's talker state: its phoneme ids and scales (the talker graph runs whole)."""

    voice: str
    phoneme_ids: list[int]
    scales: tuple[float, float, float]


@dataclass(frozen=True)
class _LoadedVoice:
    spec: VoiceSpec
    voice: Voice
    talker: ort.InferenceSession
    vocoder: ort.InferenceSession
    latent_name: str  # the vocoder's input, the talker's first output
    frame_count_name: str  # the talker's second output
    channels: int


def _session(graph: Path | bytes, intra_op_threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only
    source = graph if isinstance(graph, bytes) else str(graph)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _non_negative_or_none(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class PiperBackend:
    """The bundled voice (the default) plus every voice in `PiperConfig.voices_dir`.

    `noise_scale` / `noise_w` override every voice's config (0 makes the output
    deterministic; tests use it). `talk` runs only in the talker thread and `vocode` only
    in the vocoder thread: each stage has its own ONNX Runtime session per voice.
    """

    name = "piper"
    # A step runs whole segments through an ONNX Runtime session (safe to run from two
    # threads); phonemising is serialised by a lock (espeak-ng is one global instance).
    concurrent_talker_steps = True
    # vocode runs the vocoder session, which two threads may run at once (vocoder.workers)
    concurrent_vocode_calls = True

    def __init__(
        self,
        piper: PiperConfig | None = None,
        talker: TalkerConfig | None = None,
        vocoder: VocoderConfig | None = None,
        *,
        noise_scale: float | None = None,
        noise_w: float | None = None,
    ) -> None:
        piper = piper or PiperConfig()
        talker = talker or TalkerConfig()
        vocoder = vocoder or VocoderConfig()
        # keyword arguments override the config (tests pin noise to 0 this way)
        noise_scale = piper.noise_scale if noise_scale is None else noise_scale
        noise_w = piper.noise_w if noise_w is None else noise_w
        _non_negative_or_none("noise_scale", noise_scale)
        _non_negative_or_none("noise_w", noise_w)
        self._noise_scale = noise_scale
        self._noise_w = noise_w
        self._output_gain = float(piper.output_gain)
        self._phonemize_lock = threading.Lock()

        default_path = Path(piper.model_path) if piper.model_path else bundled_model_path()
        specs = [load_voice_spec(default_path)]
        if piper.voices_dir:
            specs.extend(discover_voices(piper.voices_dir))
        self._voices: dict[str, _LoadedVoice] = {}
        for spec in specs:
            if spec.id in self._voices:
                logger.warning(
                    "voice %s in %s repeats a loaded voice id: skipped", spec.id, spec.model_path
                )
                continue
            self._voices[spec.id] = self._load(spec, piper.cache_dir, talker, vocoder)
        self._default = specs[0].id
        default_voice = self._voices[self._default].voice
        self.sample_rate_hz = default_voice.sample_rate_hz
        self.samples_per_frame = default_voice.samples_per_frame

    @staticmethod
    def _load(
        spec: VoiceSpec, cache_dir: str | None, talker: TalkerConfig, vocoder: VocoderConfig
    ) -> _LoadedVoice:
        split = load_split(spec.model_path, cache_dir, spec.id)
        try:
            sessions = _sessions(split, talker, vocoder)
        except Exception as error:  # ORT raises its own RuntimeError subclasses
            if not split.cached:
                raise VoiceLoadError(
                    f"voice {spec.id!r}: cannot load its cut graphs: {error}"
                ) from error
            logger.warning(
                "voice %s: cached cut graphs failed to load (%s); cutting again", spec.id, error
            )
            sessions = _sessions(
                load_split(spec.model_path, cache_dir, spec.id, refresh=True), talker, vocoder
            )
        talker_session, vocoder_session = sessions
        talker_outputs = talker_session.get_outputs()
        latent, frame_count = (o.name for o in talker_outputs)
        channels = talker_outputs[0].shape[1]
        if [i.name for i in vocoder_session.get_inputs()] != [latent] or not isinstance(
            channels, int
        ):
            raise VoiceLoadError(
                f"voice {spec.id!r}: cut graphs do not fit together (cache at fault?)"
            )
        voice = Voice(
            id=spec.id,
            name=spec.name,
            language=spec.language,
            sample_rate_hz=spec.sample_rate_hz,
            samples_per_frame=spec.samples_per_frame,
        )
        return _LoadedVoice(
            spec, voice, talker_session, vocoder_session, latent, frame_count, channels
        )

    # Backend protocol

    def voices(self) -> list[Voice]:
        return [loaded.voice for loaded in self._voices.values()]

    def default_voice(self) -> str:
        return self._default

    def open_segment(self, request: TalkRequest) -> PiperSegment:
        """Phonemise the segment (espeak-ng); the talker graph runs in `step`."""
        loaded = self._get(request.voice)
        scales = self.scales(request.voice, request.speed)
        with self._phonemize_lock:
            ids = text_to_ids(loaded.spec, request.text)
        return PiperSegment(request.voice, ids, scales)

    def step(self, segments: Sequence[PiperSegment]) -> list[TalkStep]:
        """A whole segment per step: float32 [frames, channels] (none for text with no
        phonemes). Segments of different lengths run one after another."""
        results = []
        for segment in segments:
            if segment.phoneme_ids:
                frames = self.talk_ids(segment.voice, segment.phoneme_ids, segment.scales)
            else:
                frames = np.zeros((0, self._get(segment.voice).channels), dtype=np.float32)
            results.append(TalkStep(frames=frames, done=True))
        return results

    def close_segment(self, segment: PiperSegment) -> None:
        segment.phoneme_ids = []

    def vocode(self, items: Sequence[VocodeItem]) -> list[np.ndarray]:
        """Items of one voice and equal length share one decoder call."""
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

        for (voice_id, _), indices in groups.items():
            loaded = self._voices[voice_id]
            batch = np.stack([np.asarray(items[i].frames, dtype=np.float32).T for i in indices])
            (audio,) = loaded.vocoder.run(None, {loaded.latent_name: batch})
            audio = audio.reshape(len(indices), -1)
            hop = loaded.spec.samples_per_frame
            for row, index in enumerate(indices):
                item = items[index]
                start = item.emit_offset_frames * hop
                piece = audio[row, start : start + item.emit_frames * hop] * self._output_gain
                pcm[index] = np.clip(piece, -1.0, 1.0).astype(np.float32, copy=False)
        return pcm  # type: ignore[return-value]  # every slot is filled above

    def close(self) -> None:
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
        """The talker on given ids: float32 [frames, channels], C-contiguous."""
        loaded = self._get(voice_id)
        ids = np.asarray(phoneme_ids, dtype=np.int64)[np.newaxis, :]
        latent, frame_count = loaded.talker.run(
            [loaded.latent_name, loaded.frame_count_name],
            {
                "input": ids,
                "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
                "scales": np.asarray(scales, dtype=np.float32),
            },
        )
        frames = int(frame_count[0])
        return np.ascontiguousarray(latent[0, :, :frames].T, dtype=np.float32)

    def _get(self, voice_id: str) -> _LoadedVoice:
        try:
            return self._voices[voice_id]
        except KeyError:
            raise UnknownPiperVoice(
                f"unknown voice {voice_id!r}; available: {', '.join(self._voices)}"
            ) from None


def _sessions(
    split: SplitGraphs, talker: TalkerConfig, vocoder: VocoderConfig
) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    return (
        _session(split.talker, talker.intra_op_threads),
        _session(split.vocoder, vocoder.intra_op_threads),
    )
