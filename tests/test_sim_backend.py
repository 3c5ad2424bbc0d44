"""The sim backend: exact frame counts, set costs, a signal that proves order."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.backend import TalkRequest, TalkStep, VocodeItem
from pipeline.backends import BackendConfig, build_backend
from pipeline.backends.sim import (
    SimBackend,
    decode_sim_signal,
    encode_sim_signal,
    expected_frames,
    frames_for_text,
)
from pipeline.config import (
    SimConfig,
    TalkerConfig,
    TextConfig,
    VocoderConfig,
)
from pipeline.text import segment_options, split_text
from scheduling.errors import ConfigError


def _frames(tag: int, first: int, count: int) -> np.ndarray:
    frames = np.empty((count, 2), dtype=np.int64)
    frames[:, 0] = tag
    frames[:, 1] = np.arange(first, first + count)
    return frames


def test_frames_for_text_follows_the_documented_formula() -> None:
    assert frames_for_text("") == 2
    assert frames_for_text("ab") == 2
    assert frames_for_text("x" * 12) == 10  # 12 / 1.2, no float noise
    assert frames_for_text("x" * 13) == 11
    assert frames_for_text("x" * 12, 2.0) == 5
    assert frames_for_text("x" * 12, 0.5) == 20


def test_expected_frames_sums_the_engine_segments() -> None:
    text = "Hello there, this is a test of the sim voice. And a second sentence."
    segments = split_text(text, first_fragment_words=6)
    assert len(segments) == 3
    assert expected_frames(text, 1.5, TextConfig(first_fragment_words=6)) == sum(
        frames_for_text(s, 1.5) for s in segments
    )
    assert expected_frames(text) == sum(
        frames_for_text(s) for s in split_text(text, **segment_options(TextConfig()))
    )


def _talk_all(backend: SimBackend, request: TalkRequest) -> list[TalkStep]:
    segment = backend.open_segment(request)
    steps = [backend.step([segment])[0]]
    while not steps[-1].done:
        steps.append(backend.step([segment])[0])
    backend.close_segment(segment)
    return steps


def test_steps_yield_tagged_numbered_frames_until_the_segment_ends() -> None:
    backend = SimBackend(SimConfig(talker_frames_per_step=4, talker_step_base_ms=0.0))
    text = "x" * 12  # 10 frames
    request = TalkRequest(text, "sim", 1.0, stream_tag=7, segment_index=1, first_frame_index=30)
    steps = _talk_all(backend, request)
    assert [(len(s.frames), s.done) for s in steps] == [(4, False), (4, False), (2, True)]
    frames = np.concatenate([s.frames for s in steps])
    assert frames.dtype == np.int64 and frames.shape == (10, 2)
    assert (frames[:, 0] == 7).all()
    assert frames[:, 1].tolist() == list(range(30, 40))
    assert backend.open_segments == 0


def test_a_batched_step_advances_each_segment_on_its_own() -> None:
    backend = SimBackend(SimConfig(talker_frames_per_step=3, talker_step_base_ms=0.0))
    short = backend.open_segment(TalkRequest("x" * 4, "sim", 1.0, 1, 0, 0))  # 4 frames
    long = backend.open_segment(TalkRequest("x" * 12, "sim", 1.0, 2, 0, 5))  # 10 frames
    first = backend.step([short, long])
    assert [s.frames[:, 1].tolist() for s in first] == [[0, 1, 2], [5, 6, 7]]
    (only_long,) = backend.step([long])  # `short` sits this step out and keeps its place
    assert only_long.frames[:, 1].tolist() == [8, 9, 10]
    second = backend.step([short, long])
    assert [(s.frames[:, 1].tolist(), s.done) for s in second] == [
        ([3], True),
        ([11, 12, 13], False),
    ]
    assert backend.open_segments == 2
    backend.close_segment(short)
    backend.close_segment(short)  # idempotent
    assert backend.open_segments == 1


def test_a_step_costs_its_base_plus_a_share_per_segment() -> None:
    slept: list[float] = []
    config = SimConfig(talker_step_base_ms=2.0, talker_step_per_stream_ms=0.5)
    backend = SimBackend(config, sleep=slept.append)
    segments = [backend.open_segment(TalkRequest("x" * 24, "sim", 1.0, i, 0, 0)) for i in range(3)]
    backend.step(segments)
    backend.step(segments[:1])
    assert slept == pytest.approx([0.0035, 0.0025])


def test_vocode_returns_the_emitted_frames_only_and_decodes_back() -> None:
    backend = SimBackend(SimConfig(vocoder_base_ms=0.0, vocoder_per_frame_ms=0.0))
    items = [
        VocodeItem("sim", _frames(3, 10, 8), emit_offset_frames=2, emit_frames=4),
        VocodeItem("Sim", _frames(4, 0, 3), emit_offset_frames=0, emit_frames=3),
    ]
    pcms = backend.vocode(items)
    assert [p.dtype for p in pcms] == [np.float32, np.float32]
    assert [p.size for p in pcms] == [4 * 1920, 3 * 1920]
    assert decode_sim_signal(pcms[0], 1920) == [(3, 12), (3, 13), (3, 14), (3, 15)]
    assert decode_sim_signal(pcms[1], 1920) == [(4, 0), (4, 1), (4, 2)]
    assert np.abs(pcms[0]).max() <= 1.0


@pytest.mark.parametrize("scale", [32767.0, 32768.0])
def test_signal_survives_int16_quantisation(scale: float) -> None:
    tags = [0, 1, 4095, 4096, 2**24 - 1, 123456]
    frames = np.array([[t, (t * 7919) % 2**24] for t in tags], dtype=np.int64)
    pcm = encode_sim_signal(frames, 1920)
    as_int16 = np.clip(np.round(pcm * scale), -32768, 32767).astype(np.int16)
    assert decode_sim_signal(as_int16, 1920) == [tuple(f) for f in frames.tolist()]


def test_decode_rejects_a_partial_frame() -> None:
    with pytest.raises(ValueError, match="whole number"):
        decode_sim_signal(np.zeros(1921, dtype=np.float32), 1920)


def test_vocoder_costs_base_per_call_when_batched_and_per_item_when_not() -> None:
    items = [VocodeItem("sim", _frames(1, 0, 2), 0, 2) for _ in range(3)]
    slept: list[float] = []
    config = SimConfig(vocoder_base_ms=30.0, vocoder_per_frame_ms=10.0)
    SimBackend(config, sleep=slept.append).vocode(items)  # one base, 6 frames
    SimBackend(replace(config, batched=False), sleep=slept.append).vocode(items)
    assert slept == pytest.approx([0.090, 0.150])


def test_voice_and_errors() -> None:
    backend = SimBackend()
    (voice,) = backend.voices()
    assert (voice.id, voice.sample_rate_hz, voice.samples_per_frame) == ("sim", 24000, 1920)
    assert backend.default_voice() == "sim"
    with pytest.raises(ValueError, match="unknown sim voice"):
        backend.open_segment(TalkRequest("hi", "alloy", 1.0, 0, 0, 0))
    with pytest.raises(ValueError, match="emit range"):
        backend.vocode([VocodeItem("sim", _frames(1, 0, 2), 1, 2)])
    with pytest.raises(ConfigError, match="samples_per_frame"):
        SimBackend(SimConfig(samples_per_frame=2))


def test_build_backend_makes_the_sim_backend() -> None:
    sim = SimConfig(samples_per_frame=480)
    backend = build_backend(
        BackendConfig(kind="sim"), sim, talker=TalkerConfig(), vocoder=VocoderConfig()
    )
    assert isinstance(backend, SimBackend)
    assert backend.samples_per_frame == 480
    assert isinstance(build_backend("sim"), SimBackend)  # its section's defaults
