"""The seam sweep (benchmarks/seams.py): its measure, and the default settings on a sample."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.settings import load_settings
from benchmarks.seams import TARGET_DB, chunk_layout, seam_snrs_db, sweep, sweep_sentences
from pipeline.backends.piper import PiperBackend
from scheduling import ChunkingConfig

ROOT = Path(__file__).resolve().parent.parent


def test_a_seam_is_graded_by_the_error_near_it_against_the_sentence_level() -> None:
    hop = 4
    whole = np.sin(np.arange(400 * hop) * 0.05).astype(np.float32)
    served = whole.copy()
    served[100 * hop : 101 * hop] += 0.01  # a small click at frame 100
    near, far = seam_snrs_db(whole, served, [100, 300], hop, window_frames=8)
    assert 30.0 < near < 50.0 and far > 250.0
    # the same click at a seam in silence is graded against the sentence, not the silence
    quiet = whole.copy()
    quiet[90 * hop : 110 * hop] = 0.0
    clicked = quiet.copy()
    clicked[100 * hop : 101 * hop] += 0.01
    (in_pause,) = seam_snrs_db(quiet, clicked, [100], hop, window_frames=8)
    assert in_pause == pytest.approx(near, abs=0.5)


def test_the_layout_is_the_planners_ramp_then_steady_chunks() -> None:
    chunking = ChunkingConfig(chunk_frames=64, ramp=(8, 16, 32))
    assert chunk_layout(130, chunking, 0) == [(0, 8), (8, 24), (24, 56), (56, 120), (120, 130)]
    assert chunk_layout(130, chunking, 3) == [(0, 64), (64, 128), (128, 130)]


def test_the_sweep_has_200_sentences_of_varied_punctuation() -> None:
    sentences = sweep_sentences()
    assert len(sentences) >= 200
    assert len(set(sentences)) == len(sentences)
    for mark in ',;:?!—"':
        assert any(mark in s for s in sentences), mark
    lengths = [len(s.split()) for s in sentences]
    assert min(lengths) <= 2 and max(lengths) >= 30


@pytest.mark.slow
def test_every_seam_of_a_sample_is_40_db_at_the_default_settings() -> None:
    settings = load_settings(ROOT / "configs" / "default.yaml", environ={})
    backend = PiperBackend(settings.piper, noise_scale=0.0, noise_w=0.0)
    sample = sweep_sentences()[::20]  # 11 sentences across the corpus
    result = sweep(backend, settings.chunking, sample)
    assert result.seams > 50
    assert result.worst_db >= TARGET_DB, result.line()
    # the sweep can tell: the old context of 4 frames leaves audible seams
    narrow = replace(settings.chunking, left_context_frames=4, right_context_frames=4)
    assert sweep(backend, narrow, sample).worst_db < TARGET_DB
