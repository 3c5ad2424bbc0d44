"""Typed configuration of the pipeline: the engine, its two stages, and the backends.

Frozen dataclasses that validate themselves through scheduling/validation.py (ConfigError
names the field), so that the engine can be built from plain Python in tests and
benchmarks, and app/settings.py can embed them in the YAML-backed settings. Their defaults
are the measured ones: configs/default.yaml writes out the same values (a test compares
them field by field).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.validation import (
    check_bool,
    check_choice,
    check_int,
    check_non_negative,
    check_optional_non_negative,
    check_positive,
    check_text,
)

BACKEND_KINDS = ("piper", "sim")


@dataclass(frozen=True)
class BackendConfig:
    kind: str = "piper"  # which backend serves: piper (real voice) or sim

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, BACKEND_KINDS)


@dataclass(frozen=True)
class TalkerConfig:
    intra_op_threads: int = 1  # ONNX Runtime threads inside the talker's one worker thread
    batch: int = 1  # most open segments stepped together in one talker step
    high_water_s: float = 8.0  # a stream this many seconds of audio ahead gets no talker work
    first_fragment_words: int = 6  # a first sentence longer than this is cut early
    max_segment_chars: int = 300  # sentences longer than this split at clause boundaries

    def __post_init__(self) -> None:
        check_int("intra_op_threads", self.intra_op_threads, 1)
        check_int("batch", self.batch, 1)
        check_positive("high_water_s", self.high_water_s)
        check_int("first_fragment_words", self.first_fragment_words, 0)
        check_int("max_segment_chars", self.max_segment_chars, 20)


@dataclass(frozen=True)
class VocoderConfig:
    intra_op_threads: int = 1  # ONNX Runtime threads inside the vocoder's one worker thread

    def __post_init__(self) -> None:
        check_int("intra_op_threads", self.intra_op_threads, 1)


@dataclass(frozen=True)
class EngineConfig:
    max_pending_audio_s: float = 10.0  # audio a client has not read yet; beyond it the stream parks
    capacity_window_s: float = 5.0  # moving-average window of the capacity estimate
    # assumed before anything was measured (0 = unknown: admit until measured)
    initial_capacity_audio_s_per_s: float = 0.0

    def __post_init__(self) -> None:
        check_positive("max_pending_audio_s", self.max_pending_audio_s)
        check_positive("capacity_window_s", self.capacity_window_s)
        check_non_negative("initial_capacity_audio_s_per_s", self.initial_capacity_audio_s_per_s)


@dataclass(frozen=True)
class SimConfig:
    """The sim backend's cost model (docs/benchmarking.md): costs are set, not measured."""

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
            check_int(name, getattr(self, name), 1)
        for name in (
            "talker_step_base_ms",
            "talker_step_per_stream_ms",
            "vocoder_base_ms",
            "vocoder_per_frame_ms",
        ):
            check_non_negative(name, getattr(self, name))
        check_bool("batched", self.batched)


@dataclass(frozen=True)
class PiperConfig:
    model_path: str | None = None  # None: the bundled en_US-joe-medium voice
    voices_dir: str | None = None  # every <name>.onnx + <name>.onnx.json in it is served too
    cache_dir: str | None = None  # cut graphs are cached here; None: the user's cache dir
    output_gain: float = 0.8  # fixed gain (per-sentence peak normalisation cannot stream)
    noise_scale: float | None = None  # None: each voice's own; 0: deterministic output
    noise_w: float | None = None  # phoneme-duration noise; None: each voice's own

    def __post_init__(self) -> None:
        for name in ("model_path", "voices_dir", "cache_dir"):
            check_text(name, getattr(self, name), optional=True)
        check_positive("output_gain", self.output_gain)
        check_optional_non_negative("noise_scale", self.noise_scale)
        check_optional_non_negative("noise_w", self.noise_w)
