"""Helpers of the codec-LM tests: the tiny config with its model cached once per session."""

from __future__ import annotations

from pathlib import Path

from app.settings import Settings, load_settings
from pipeline.config import TextConfig
from pipeline.text import split_text

TINY_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "codec-lm-tiny.yaml"


def tiny_settings(cache_dir: Path, *overrides: str) -> Settings:
    """configs/codec-lm-tiny.yaml with the model cached in `cache_dir`, shorter segments."""
    return load_settings(
        TINY_CONFIG,
        [
            f"codec_lm.cache_dir={cache_dir}",
            "codec_lm.device=cpu",
            "codec_lm.max_frames_per_segment=40",
            *overrides,
        ],
        environ={},
    )


def expected_frames(backend, text: str, options: TextConfig, speed: float = 1.0) -> int:
    """Frames a random-weight model makes for `text`: its bound, summed over the segments
    (a random model does not end a segment by itself)."""
    segments = split_text(
        text,
        first_fragment_words=options.first_fragment_words,
        max_segment_chars=options.max_segment_chars,
    )
    return sum(backend.max_frames(segment, speed) for segment in segments)
