"""The codec-LM backend (CSM + Mimi) on the tiny random-weight model, float32 on the CPU:
a stream's frames do not depend on who else is in the batch (joins, leaves, a cancel, steps
sat out), caches are freed, segment ends, and the batched Mimi vocoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from codec_lm_support import tiny_settings

from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends.codec_lm import CodecLMBackend
from pipeline.config import CodecLMConfig
from scheduling.errors import ConfigError

TEXTS = (
    "Hello there, how are you today?",
    "A longer sentence that keeps going for quite a while longer.",
    "Short one.",
    "The fourth voice joins late and leaves early.",
    "Number five.",
)


@pytest.fixture(scope="session")
def codec_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "codec-lm-cache"


@pytest.fixture(scope="module")
def backend(codec_cache: Path) -> CodecLMBackend:
    return CodecLMBackend(tiny_settings(codec_cache).codec_lm)


def _request(text: str, voice: str = "speaker-0", speed: float = 1.0) -> TalkRequest:
    return TalkRequest(
        text=text, voice=voice, speed=speed, stream_tag=0, segment_index=0, first_frame_index=0
    )


def _alone(backend: CodecLMBackend, text: str, voice: str = "speaker-0") -> np.ndarray:
    segment = backend.open_segment(_request(text, voice))
    frames = []
    try:
        while True:
            (step,) = backend.step([segment])
            frames.append(step.frames)
            if step.done:
                return np.concatenate(frames)
    finally:
        backend.close_segment(segment)


def test_the_model_is_saved_and_loaded_back_like_a_checkpoint(
    backend: CodecLMBackend, codec_cache: Path
) -> None:
    saved = [p for p in codec_cache.iterdir() if p.name.startswith("random-")]
    assert len(saved) == 1
    names = {p.name for p in saved[0].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert backend.loaded.source == f"random:{saved[0].name}"
    assert backend.loaded.device.type == "cpu" and backend.loaded.dtype == torch.float32
    assert (backend.sample_rate_hz, backend.samples_per_frame) == (24000, 1920)
    assert [v.id for v in backend.voices()] == ["speaker-0", "speaker-1"]


def test_a_segment_makes_its_bounded_frames_of_every_codebook(backend: CodecLMBackend) -> None:
    frames = _alone(backend, TEXTS[0])
    assert frames.dtype == np.int64 and frames.shape == (backend.max_frames(TEXTS[0]), 8)
    assert frames.min() >= 0 and frames.max() < 64  # codes the codec can decode
    assert len(np.unique(frames)) > 8  # not a constant frame
    assert backend.max_frames("x" * 1000) == 40  # the configured cap
    assert backend.max_frames("ab") == 2  # the floor
    # the speaker is part of the prompt
    assert not np.array_equal(frames, _alone(backend, TEXTS[0], voice="speaker-1"))


def test_frames_do_not_depend_on_the_batch(backend: CodecLMBackend) -> None:
    """Greedy decoding: each stream alone, then all five with joins, leaves, steps sat out and
    a cancel, must give exactly the same frames (float32 CPU)."""
    alone = [_alone(backend, text) for text in TEXTS]
    assert backend.live_segments == 0
    joins = {0: [0, 1], 2: [2], 3: [3], 6: [4]}  # step -> streams opening before it
    cancel_at = {3: 9}  # stream 3 is cancelled before step 9
    open_: dict[int, object] = {}
    got: dict[int, list[np.ndarray]] = {i: [] for i in range(len(TEXTS))}
    step_no = 0
    while step_no < 200 and (open_ or step_no <= max(joins)):
        for i in joins.get(step_no, []):
            open_[i] = backend.open_segment(_request(TEXTS[i]))
        for i, at in cancel_at.items():
            if at == step_no and i in open_:
                live = backend.live_segments
                backend.close_segment(open_.pop(i))
                assert backend.live_segments == live - 1
        # stream 1 sits out every third step, stream 0 every fifth: they keep their state
        chosen = [i for i in sorted(open_) if not (i == 1 and step_no % 3 == 2)]
        chosen = [i for i in chosen if not (i == 0 and step_no % 5 == 4)]
        for i, step in zip(chosen, backend.step([open_[i] for i in chosen]), strict=True):
            got[i].append(step.frames)
            if step.done:
                backend.close_segment(open_.pop(i))
        step_no += 1
    assert not open_
    for i in (0, 1, 2, 4):
        np.testing.assert_array_equal(np.concatenate(got[i]), alone[i])
    cancelled = np.concatenate(got[3])
    assert 0 < len(cancelled) < len(alone[3])
    np.testing.assert_array_equal(cancelled, alone[3][: len(cancelled)])
    assert backend.live_segments == 0


def test_close_is_idempotent_and_frees_the_slot_for_reuse(backend: CodecLMBackend) -> None:
    segments = [backend.open_segment(_request(text)) for text in TEXTS]
    assert backend.live_segments == len(TEXTS)
    backend.step(segments[:2])
    backend.close_segment(segments[0])
    backend.close_segment(segments[0])
    assert backend.live_segments == len(TEXTS) - 1
    again = backend.open_segment(_request(TEXTS[0]))
    assert again.slot == segments[0].slot  # the freed slot is reused
    with pytest.raises(ValueError, match="closed"):
        backend.step([segments[0]])
    for segment in [*segments[1:], again]:
        backend.close_segment(segment)
    assert backend.live_segments == 0


def test_the_cache_grows_past_its_initial_slots(codec_cache: Path) -> None:
    backend = CodecLMBackend(tiny_settings(codec_cache, "codec_lm.initial_slots=2").codec_lm)
    alone = _alone(backend, TEXTS[2])
    segments = [backend.open_segment(_request(TEXTS[i % 5])) for i in range(7)]
    assert backend.live_segments == 7 and backend.stepper.cache.capacity >= 7
    first = []
    while not segments[2].done:  # a step may hand back no frame (prefill, overlap)
        first.append(backend.step([s for s in segments if not s.done])[2].frames)
    np.testing.assert_array_equal(np.concatenate(first), alone)
    for segment in segments:
        backend.close_segment(segment)
    assert backend.live_segments == 0


def test_an_all_zero_frame_ends_the_segment(codec_cache: Path) -> None:
    backend = CodecLMBackend(tiny_settings(codec_cache).codec_lm)
    with torch.no_grad():  # every logit 0: argmax picks code 0 in every codebook
        backend.loaded.model.lm_head.weight.zero_()
        backend.loaded.model.depth_decoder.codebooks_head.weight.zero_()
    segment = backend.open_segment(_request(TEXTS[0]))
    steps = []
    while not (steps and steps[-1].done) and len(steps) < 5:
        steps.extend(backend.step([segment]))
    # the prompt (36 tokens) takes two 32-token prefill steps; the first frame ends it
    assert len(steps) == 2 and steps[-1].done
    assert all(step.frames.shape == (0, 8) for step in steps)
    backend.close_segment(segment)


def test_unknown_voices_and_bad_frames_are_refused(backend: CodecLMBackend) -> None:
    with pytest.raises(ValueError, match="voice"):
        backend.open_segment(_request("hello", voice="alloy"))
    with pytest.raises(ValueError, match="frames"):
        backend.vocode([VocodeItem("speaker-0", np.zeros((3, 2), np.int64), 0, 3)])
    assert backend.live_segments == 0


def _codes(seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 64, size=(frames, 8), dtype=np.int64)


def test_pcm_length_matches_the_emitted_frames(backend: CodecLMBackend) -> None:
    items = [
        VocodeItem("speaker-0", _codes(1, 10), emit_offset_frames=4, emit_frames=6),
        VocodeItem("speaker-1", _codes(2, 3), emit_offset_frames=0, emit_frames=2),
        VocodeItem("speaker-0", _codes(3, 5), emit_offset_frames=5, emit_frames=0),
    ]
    pcm = backend.vocode(items)
    assert [p.shape for p in pcm] == [(6 * 1920,), (2 * 1920,), (0,)]
    assert all(p.dtype == np.float32 and np.all(np.abs(p) <= 1.0) for p in pcm)
    assert np.std(pcm[0]) > 0
    # the audio depends on the codes (the random codebooks are not all alike)
    (other,) = backend.vocode([VocodeItem("speaker-0", _codes(11, 10), 4, 6)])
    assert np.abs(other - pcm[0]).max() > 0.1


def test_batched_vocoder_equals_decoding_each_chunk_alone(backend: CodecLMBackend) -> None:
    items = [
        VocodeItem("speaker-0", _codes(seed, frames), emit_offset_frames=left, emit_frames=emit)
        for seed, frames, left, emit in [(4, 12, 8, 4), (5, 2, 0, 2), (6, 9, 1, 8), (7, 16, 8, 8)]
    ]
    batched = backend.vocode(items)
    for item, pcm in zip(items, batched, strict=True):
        (alone,) = backend.vocode([item])
        # equal to float32 noise: the convolution kernels sum in a batch-dependent order
        np.testing.assert_allclose(pcm, alone, rtol=0, atol=1e-4)


def test_a_chunk_equals_the_same_frames_of_a_whole_decode(backend: CodecLMBackend) -> None:
    """Mimi is causal: a chunk decoded from the segment's start is exactly the whole decode's
    samples (so left context is all a chunk needs, and its error comes from context cut)."""
    codes = _codes(8, 20)
    (whole,) = backend.vocode([VocodeItem("speaker-0", codes, 0, 20)])
    (chunk,) = backend.vocode([VocodeItem("speaker-0", codes[:12], 6, 6)])
    np.testing.assert_allclose(chunk, whole[6 * 1920 : 12 * 1920], rtol=0, atol=1e-4)


def test_transformers_streaming_decoder_state_is_not_exact(backend: CodecLMBackend) -> None:
    """Why the vocoder uses left context: decoding chunk by chunk with the decoder cache that
    transformers returns differs from a whole-segment decode (its convolutions restart)."""
    codec = backend.loaded.model.codec_model
    codes = torch.from_numpy(_codes(9, 12).T[None].copy())
    with torch.inference_mode():
        whole = codec.decode(codes)[0][0, 0]
        first = codec.decode(codes[..., :6], use_cache=True, return_dict=True)
        cache = first.decoder_cache if hasattr(first, "decoder_cache") else first[1]
        second = codec.decode(codes[..., 6:], decoder_cache=cache)[0][0, 0]
    streamed = torch.cat([first.audio_values[0, 0], second])
    assert streamed.shape == whole.shape
    assert (streamed - whole).abs().max() > 1e-3


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="device"):
        CodecLMConfig(device="tpu")
    with pytest.raises(ConfigError, match="codebook_size"):
        CodecLMConfig(codebook_size=2048)
    with pytest.raises(ConfigError, match="max_frames_per_segment"):
        CodecLMConfig(min_frames_per_segment=10, max_frames_per_segment=5)
    with pytest.raises(ConfigError, match="backbone_heads"):
        CodecLMConfig(backbone_heads=30)


def test_padding_to_a_graph_bucket_leaves_each_chunk_unchanged(backend: CodecLMBackend) -> None:
    """What CUDA runs: K and the frames padded up to a (K, frames) bucket (code 0 rows and
    frames after each chunk); Mimi is causal, so each chunk's samples stay the same."""
    from pipeline.backends.codec_lm.vocoder import MimiVocoder

    padded = MimiVocoder(
        backend.loaded.model.codec_model,
        num_codebooks=8,
        samples_per_frame=1920,
        max_batch=8,
        max_frames=16,
        pad_to_buckets=True,
    )
    assert padded.batch_buckets == [1, 2, 4, 8] and padded.frame_buckets == [4, 8, 16]
    chunks = [_codes(21, 5), _codes(22, 9), _codes(23, 3)]  # K 3 -> 4, 9 frames -> 16
    for got, want in zip(
        padded.decode_batch(chunks), backend.vocoder.decode_batch(chunks), strict=True
    ):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_mimi_without_host_reads_decodes_what_transformers_mimi_does(
    backend: CodecLMBackend, codec_cache: Path
) -> None:
    """`host_free_mimi` (int padding arithmetic) changes no sample of a decode: the same
    codes through a freshly loaded, untouched Mimi give the same audio."""
    from pipeline.backends.codec_lm.loading import load_model

    untouched = load_model(tiny_settings(codec_cache).codec_lm).model.codec_model
    patched = backend.loaded.model.codec_model

    def convolutions(codec):
        return [m for m in codec.modules() if hasattr(m, "_get_extra_padding_for_conv1d")]

    assert all("padding_total" in m._buffers for m in convolutions(untouched))  # tensors
    assert convolutions(patched) and all(
        isinstance(m.padding_total, int) for m in convolutions(patched)
    )
    for frames in (1, 5, 12):
        codes = torch.from_numpy(_codes(frames, frames).T[None].copy())
        with torch.inference_mode():
            want = untouched.decode(codes)[0]
            got = patched.decode(codes)[0]
        assert torch.equal(got, want)


def test_mimi_reads_nothing_back_from_the_device_while_a_graph_is_captured(
    backend: CodecLMBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA graph cannot hold a read of the device from the host (`.item()`, a tensor's
    truth): Mimi's capture failed on every bucket on an H200 until each is gone. Here a
    capture is declared on (as torch reports one) and every such read fails the test."""
    from torch.utils._python_dispatch import TorchDispatchMode

    host_reads = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal"}
    seen: list[str] = []

    class NoHostReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in host_reads:
                seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    vocoder = backend.vocoder
    vocoder._buffers_for(2, 8)[0].copy_(torch.from_numpy(np.stack([_codes(3, 8).T] * 2)))
    with NoHostReads():
        vocoder._decode(2, 8)
    vocoder._buffers.pop((2, 8))
    assert seen == []


def test_its_capacity_is_what_its_gpus_cost_table_sustains(codec_cache: Path) -> None:
    """With `codec_lm.cost_table` (what gpu_check measured on its GPU), the backend says
    the streams its loop sustains at 1x by the gpu_model's arithmetic for its own prefill
    settings and frame length, and the Engine's capacity is that figure; without one it
    says nothing. A table path that does not exist fails at start-up, naming it."""
    from pipeline.backends.gpu_costs import load_cost_table, sustained_streams
    from pipeline.engine import Engine
    from scheduling import AdmissionConfig

    path = "configs/gpu-costs/h200-20261204-1453-backbone-prefill.yaml"
    settings = tiny_settings(codec_cache, f"codec_lm.cost_table={path}")
    backend = CodecLMBackend(settings.codec_lm)
    cfg = settings.codec_lm
    frame_ms = 1000.0 * backend.samples_per_frame / backend.sample_rate_hz
    want = sustained_streams(
        load_cost_table(path),
        prefill_rows=cfg.prefill_rows,
        prefill_chunk_tokens=cfg.prefill_chunk_tokens,
        frame_ms=frame_ms,
    )
    assert frame_ms == pytest.approx(80.0) and want is not None and want > 64
    assert backend.sustained_streams() == want
    # a smaller prefill per step leaves more of a frame to decode: never fewer streams
    fewer = sustained_streams(
        load_cost_table(path), prefill_rows=8, prefill_chunk_tokens=128, frame_ms=frame_ms
    )
    assert fewer is None or fewer <= want
    engine = Engine(
        backend,
        scheduling=settings.scheduling,
        chunking=settings.chunking,
        admission=AdmissionConfig(),
        engine=settings.engine,
        talker=settings.talker,
        text=settings.text,
    )
    assert engine.capacity(0.0) == want
    assert CodecLMBackend(tiny_settings(codec_cache).codec_lm).sustained_streams() is None
    with pytest.raises(ConfigError, match="no-such-table"):
        CodecLMBackend(
            tiny_settings(codec_cache, "codec_lm.cost_table=no-such-table.yaml").codec_lm
        )
