"""The default voice: Piper (VITS) voices cut into a talker graph and a vocoder graph."""

from __future__ import annotations

from pipeline.backends.piper.backend import PiperBackend
from pipeline.backends.piper.errors import (
    GraphSplitError,
    PiperError,
    UnknownPiperVoice,
    VoiceLoadError,
)
from pipeline.backends.piper.graph_split import default_cache_dir, load_split, split_model
from pipeline.backends.piper.reference import synthesize_whole
from pipeline.backends.piper.voices import VoiceSpec, bundled_model_path

__all__ = [
    "GraphSplitError",
    "PiperBackend",
    "PiperError",
    "UnknownPiperVoice",
    "VoiceLoadError",
    "VoiceSpec",
    "bundled_model_path",
    "default_cache_dir",
    "load_split",
    "split_model",
    "synthesize_whole",
]
