"""Backends: `build_backend` picks one from the config (the piper module loads lazily)."""

from __future__ import annotations

from pipeline.backend import Backend
from pipeline.config import BackendConfig, PiperConfig, SimConfig, TalkerConfig, VocoderConfig
from scheduling.errors import ConfigError


def build_backend(
    backend: BackendConfig,
    *,
    sim: SimConfig,
    piper: PiperConfig,
    talker: TalkerConfig,
    vocoder: VocoderConfig,
) -> Backend:
    """The backend named by `backend.kind`, loaded and ready to serve."""
    if backend.kind == "sim":
        from pipeline.backends.sim import SimBackend

        return SimBackend(sim)
    if backend.kind == "piper":
        from pipeline.backends.piper import PiperBackend  # heavy: ONNX Runtime, the voice

        return PiperBackend(piper, talker, vocoder)
    raise ConfigError(f"kind must be one of piper, sim, got {backend.kind!r}")


__all__ = ["build_backend"]
