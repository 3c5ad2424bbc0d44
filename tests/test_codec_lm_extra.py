"""The codec-LM backend's small parts: its counter-based sampler draws from the right
distribution whatever the batch; Playhead imports and serves sim/Piper without torch, and a
config asking for codec_lm without it fails with what to install; the new knobs' checks; a
fixed (graph-captured) cache refuses past its slots."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline.backends.codec_lm.sampling import (
    choose_codes,
    frame_noise,
    gumbel_noise,
    segment_seed,
)
from pipeline.backends.codec_lm.slots import KVSlots, SlotsFull
from pipeline.config import CodecLMConfig
from scheduling.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _choose(logits, seeds, positions, *, temperature=1.0, top_k=0, codebook=0):
    return choose_codes(
        logits,
        codes=logits.shape[-1],
        temperature=temperature,
        top_k=top_k,
        seeds=seeds,
        positions=positions,
        codebook=codebook,
    )


def test_samples_follow_the_softmax_and_the_top_k() -> None:
    torch.manual_seed(0)
    logits = torch.randn(16) * 1.5
    draws = 40000
    seeds = torch.arange(draws, dtype=torch.long) * 7919 + 3
    positions = torch.full((draws,), 11, dtype=torch.long)
    for temperature in (1.0, 0.5):
        codes = _choose(logits.expand(draws, 16), seeds, positions, temperature=temperature)
        seen = torch.bincount(codes, minlength=16).float() / draws
        wanted = torch.softmax(logits / temperature, dim=0)
        assert (seen - wanted).abs().max() < 0.012, (temperature, seen, wanted)
    codes = _choose(logits.expand(draws, 16), seeds, positions, top_k=3)
    top = set(torch.topk(logits, 3).indices.tolist())
    assert set(codes.unique().tolist()) == top
    seen = torch.bincount(codes, minlength=16).float()[list(top)] / draws
    wanted = torch.softmax(logits[list(top)], dim=0)
    assert (seen - wanted).abs().max() < 0.012


def test_a_rows_draw_depends_on_its_seed_and_position_only() -> None:
    logits = torch.randn(9, 64)
    seeds = torch.tensor([segment_seed(0, tag, 0) for tag in range(9)])
    positions = torch.arange(9) * 3 + 40
    batched = _choose(logits, seeds, positions, temperature=0.9, top_k=20, codebook=5)
    for row in range(9):
        alone = _choose(
            logits[row : row + 1],
            seeds[row : row + 1],
            positions[row : row + 1],
            temperature=0.9,
            top_k=20,
            codebook=5,
        )
        assert alone.item() == batched[row].item()
    noise = gumbel_noise(seeds[:1], positions[:1], 0, 64)
    assert not torch.equal(noise, gumbel_noise(seeds[:1], positions[:1] + 1, 0, 64))
    assert not torch.equal(noise, gumbel_noise(seeds[:1], positions[:1], 1, 64))
    assert not torch.equal(noise, gumbel_noise(seeds[1:2], positions[:1], 0, 64))
    assert torch.isfinite(noise).all()
    # greedy ignores the noise
    assert torch.equal(_choose(logits, seeds, positions, temperature=0), logits.argmax(-1))
    assert segment_seed(0, 1, 2) != segment_seed(0, 2, 1) != segment_seed(1, 1, 2)


_NO_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError("not installed")
sys.meta_path.insert(0, Block())
from app.settings import load_settings, SettingsError
from app.server import create_app
from pipeline import build_backend
settings = load_settings("configs/default.yaml", ["backend.kind=sim"], environ={})
backend = build_backend(settings.backend, settings.backend_config(),
                        talker=settings.talker, vocoder=settings.vocoder)
assert backend.name == "sim" and "torch" not in sys.modules
try:
    load_settings("configs/codec-lm-tiny.yaml", environ={})
except SettingsError as error:
    print("settings:", error)
try:
    from pipeline.backends.codec_lm import CodecLMBackend
except ImportError as error:
    print("import:", error)
assert "torch" not in sys.modules and "transformers" not in sys.modules
"""


def test_playhead_runs_without_torch_and_codec_lm_says_what_to_install() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_NO_TORCH)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    hint = "needs torch and transformers (the codec-lm extra): pip install 'playhead[codec-lm]'"
    assert f"settings: configs/codec-lm-tiny.yaml: backend.kind codec_lm: {hint}" in done.stdout
    assert f"import: the codec_lm backend {hint}" in done.stdout


def test_the_new_knobs_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_rows"):
        CodecLMConfig(max_rows=30, row_multiple=4)
    with pytest.raises(ConfigError, match="mimi_dtype"):
        CodecLMConfig(mimi_dtype="int8")
    with pytest.raises(ConfigError, match="prefill_chunk_tokens"):
        CodecLMConfig(prefill_chunk_tokens=0)
    with pytest.raises(ConfigError, match="overlap_steps"):
        CodecLMConfig(overlap_steps="yes")
    assert CodecLMConfig(vocoder_max_batch=0).vocoder_max_batch == 0  # Mimi graphs off


def test_a_fixed_cache_refuses_past_its_slots_and_hands_out_the_lowest() -> None:
    slots = KVSlots(
        layers=1,
        kv_heads=1,
        head_dim=2,
        max_tokens=4,
        slots=3,
        device=torch.device("cpu"),
        dtype=torch.float32,
        grow=False,
    )
    assert [slots.allocate() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(SlotsFull, match="all 3 KV-cache slots"):
        slots.allocate()
    slots.release(2)
    slots.release(0)
    assert slots.allocate() == 0  # the lowest free: live rows stay packed
    assert slots.live == 2 and slots.capacity == 3


def test_a_frames_noise_drawn_at_once_is_each_codebooks_noise_bit_for_bit() -> None:
    """The fixed step draws a frame's noise for all its codebooks in one go (a fifth of a
    step's kernels on an H200 went to drawing it codebook by codebook): the same bits."""
    seeds = torch.tensor([0, 7, 2**32 - 1, 123456789, 5], dtype=torch.int64)
    positions = torch.tensor([0, 1, 300, 2**31, 9], dtype=torch.int64)
    frame = frame_noise(seeds, positions, 32, 2051)
    assert frame.shape == (5, 32, 2051)
    for codebook in (0, 1, 17, 31):
        alone = gumbel_noise(seeds, positions, codebook, 2051)
        assert torch.equal(frame[:, codebook], alone)
    assert not torch.equal(frame[:, 0], frame[:, 1])
