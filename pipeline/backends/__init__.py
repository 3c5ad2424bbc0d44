"""Backends: `build_backend` picks one from the config (piper and codec_lm load lazily)."""

from __future__ import annotations

from pipeline.backend import Backend
from pipeline.config import (
    BackendConfig,
    CodecLMConfig,
    PiperConfig,
    SimConfig,
    TalkerConfig,
    VocoderConfig,
)
from scheduling.errors import ConfigError


def build_backend(
    backend: BackendConfig,
    *,
    sim: SimConfig,
    piper: PiperConfig,
    talker: TalkerConfig,
    vocoder: VocoderConfig,
    codec_lm: CodecLMConfig | None = None,
) -> Backend:
    """The backend named by `backend.kind`, loaded and ready to serve."""
    if backend.kind == "sim":
        from pipeline.backends.sim import SimBackend

        return SimBackend(sim)
    if backend.kind == "piper":
        from pipeline.backends.piper import PiperBackend  # heavy: ONNX Runtime, the voice

        return PiperBackend(piper, talker, vocoder)
    if backend.kind == "codec_lm":
        from pipeline.backends.codec_lm import CodecLMBackend  # heavy: torch, transformers

        return CodecLMBackend(codec_lm or CodecLMConfig())
    raise ConfigError(f"kind must be one of piper, sim, codec_lm, got {backend.kind!r}")


__all__ = ["build_backend"]
