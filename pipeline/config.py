"""Typed configuration of the pipeline: the engine, its two stages, and the backends.

Frozen dataclasses that validate themselves (ConfigError names the field), so that the
engine can be built from plain Python in tests and benchmarks, and app/settings.py can
embed them in the YAML-backed settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduling.errors import ConfigError


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")


BACKEND_KINDS = ("piper", "sim")


@dataclass(frozen=True)
class BackendConfig:
    kind: str = "piper"  # which backend serves: piper (real voice) or sim

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_KINDS:
            raise ConfigError(f"kind must be one of {', '.join(BACKEND_KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class TalkerConfig:
    intra_op_threads: int = 1  # ONNX Runtime threads inside the talker's one worker thread
    batch: int = 1  # most open segments stepped together in one talker step
    high_water_s: float = 8.0  # a stream this many seconds of audio ahead gets no talker work
    first_fragment_words: int = 6  # a first sentence longer than this is cut early
    max_segment_chars: int = 300  # sentences longer than this split at clause boundaries
    # no segment has more estimated phonemes than this (pipeline/text.py's proxy)
    max_segment_phonemes: int = 400
    # a stream's first segment is at most this long, even one unbroken token (0: no cap)
    first_segment_chars: int = 80

    def __post_init__(self) -> None:
        if not (isinstance(self.intra_op_threads, int) and self.intra_op_threads >= 1):
            raise ConfigError(
                f"intra_op_threads must be an integer >= 1, got {self.intra_op_threads!r}"
            )
        if not (isinstance(self.batch, int) and self.batch >= 1):
            raise ConfigError(f"batch must be an integer >= 1, got {self.batch!r}")
        _positive("high_water_s", self.high_water_s)
        if not (isinstance(self.first_fragment_words, int) and self.first_fragment_words >= 0):
            raise ConfigError(
                f"first_fragment_words must be an integer >= 0, got {self.first_fragment_words!r}"
            )
        if not (isinstance(self.max_segment_chars, int) and self.max_segment_chars >= 20):
            raise ConfigError(
                f"max_segment_chars must be an integer >= 20, got {self.max_segment_chars!r}"
            )
        if not (isinstance(self.max_segment_phonemes, int) and self.max_segment_phonemes >= 20):
            raise ConfigError(
                f"max_segment_phonemes must be an integer >= 20, got {self.max_segment_phonemes!r}"
            )
        if not (isinstance(self.first_segment_chars, int) and self.first_segment_chars >= 0):
            raise ConfigError(
                f"first_segment_chars must be an integer >= 0, got {self.first_segment_chars!r}"
            )


NORMALIZE_LANGUAGES = ("en",)  # languages with normalisation rules


@dataclass(frozen=True)
class NormalizeConfig:
    """The text normaliser (pipeline/normalize): numbers, dates, symbols... to words."""

    enabled: bool = True  # false: text goes to the phonemiser as written
    # languages whose rules run (a voice of another language only gets symbols dropped)
    languages: tuple[str, ...] = NORMALIZE_LANGUAGES

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"enabled must be true or false, got {self.enabled!r}")
        if isinstance(self.languages, str) or not all(
            isinstance(code, str) for code in self.languages
        ):
            raise ConfigError(f"languages must be a list of language codes, got {self.languages!r}")
        unknown = [code for code in self.languages if code not in NORMALIZE_LANGUAGES]
        if unknown:
            raise ConfigError(
                f"languages: no normalisation rules for {', '.join(map(repr, unknown))} "
                f"(available: {', '.join(NORMALIZE_LANGUAGES)})"
            )
        object.__setattr__(self, "languages", tuple(self.languages))


@dataclass(frozen=True)
class VocoderConfig:
    intra_op_threads: int = 1  # ONNX Runtime threads inside the vocoder's one worker thread

    def __post_init__(self) -> None:
        if not (isinstance(self.intra_op_threads, int) and self.intra_op_threads >= 1):
            raise ConfigError(
                f"intra_op_threads must be an integer >= 1, got {self.intra_op_threads!r}"
            )


@dataclass(frozen=True)
class EngineConfig:
    max_pending_audio_s: float = 10.0  # audio a client has not read yet; beyond it the stream parks
    capacity_window_s: float = 5.0  # moving-average window of the capacity estimate
    # assumed before anything was measured (0 = unknown: admit until measured)
    initial_capacity_audio_s_per_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("max_pending_audio_s", self.max_pending_audio_s)
        _positive("capacity_window_s", self.capacity_window_s)
        _non_negative("initial_capacity_audio_s_per_s", self.initial_capacity_audio_s_per_s)


@dataclass(frozen=True)
class SimConfig:
    """The sim backend's cost model (../shared/BENCH.md): costs are set, not measured."""

    sample_rate_hz: int = 24000
    samples_per_frame: int = 1920  # 80 ms frames, like a 12.5 Hz codec
    talker_frames_per_step: int = 4  # frames each open segment gets per talker step
    talker_step_base_ms: float = 2.0  # fixed cost of one talker step
    talker_step_per_stream_ms: float = 0.5  # cost per segment in the step
    vocoder_base_ms: float = 20.0  # fixed cost of one vocoder call
    vocoder_per_frame_ms: float = 2.0  # cost per decoded frame (context included)
    batched: bool = True  # True: one call's base cost covers the whole batch

    def __post_init__(self) -> None:
        for name in ("sample_rate_hz", "samples_per_frame", "talker_frames_per_step"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        _non_negative("talker_step_base_ms", self.talker_step_base_ms)
        _non_negative("talker_step_per_stream_ms", self.talker_step_per_stream_ms)
        _non_negative("vocoder_base_ms", self.vocoder_base_ms)
        _non_negative("vocoder_per_frame_ms", self.vocoder_per_frame_ms)


@dataclass(frozen=True)
class PiperConfig:
    model_path: str | None = None  # None: the bundled en_US-joe-medium voice
    voices_dir: str | None = None  # every <name>.onnx + <name>.onnx.json in it is served too
    cache_dir: str | None = None  # cut graphs are cached here; None: the user's cache dir
    output_gain: float = 0.8  # fixed gain (per-sentence peak normalisation cannot stream)
    noise_scale: float | None = None  # None: each voice's own; 0: deterministic output
    noise_w: float | None = None  # phoneme-duration noise; None: each voice's own

    def __post_init__(self) -> None:
        _positive("output_gain", self.output_gain)
        for name in ("noise_scale", "noise_w"):
            value = getattr(self, name)
            if value is not None:
                _non_negative(name, value)
