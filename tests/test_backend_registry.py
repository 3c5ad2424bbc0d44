"""Backends as registered kinds with declared capabilities (pipeline/backends/registry.py,
pipeline/backend.py): a backend defined here, registered like the built-in ones, serves a
stream end to end, and the engine honours each capability it turns off."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FAST_SIM, EngineFactory, read_all

from app.settings import SECTIONS, Settings, SettingsError, load_settings
from pipeline.backend import (
    AbortHandle,
    Backend,
    BackendCapabilities,
    TalkRequest,
    TalkStep,
    VocodeItem,
    backend_capabilities,
)
from pipeline.backends import (
    BackendConfig,
    BackendContext,
    BackendEntry,
    backend_kinds,
    build_backend,
    register,
    unregister,
)
from pipeline.backends.sim import SimBackend, SimSegment, decode_sim_signal, expected_frames
from pipeline.config import AloneConfig, SimConfig, TalkerConfig, VocoderConfig
from scheduling.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
CAPABILITIES = tuple(f.name for f in fields(BackendCapabilities))
TEXT = (
    "The registered backend speaks first. Then it speaks a second sentence. "
    "A third one ends the stream."
)
TEXTS = [f"Stream {i} says two sentences. The second one is here, number {i}." for i in range(6)]


@dataclass(frozen=True)
class TinyConfig:
    """The YAML section of the `tiny` backend: which capabilities it claims, and its
    vocoder's cost per call."""

    capabilities: tuple[str, ...] = ()
    vocoder_base_ms: float = 1.0

    def __post_init__(self) -> None:
        unknown = [name for name in self.capabilities if name not in CAPABILITIES]
        if unknown:
            raise ConfigError(f"capabilities: unknown {unknown} (known: {CAPABILITIES})")


class TinyBackend(SimBackend):
    """The sim backend that claims the capabilities its config names, defines every
    optional operation whatever it claims, and records how the engine used each."""

    name = "tiny"

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(SimConfig(**{**_sim_costs(), "vocoder_base_ms": config.vocoder_base_ms}))
        self.capabilities = BackendCapabilities(**{name: True for name in config.capabilities})
        self._lock = threading.Lock()
        self._running = 0
        self.calls_at_once = 0  # most vocode calls running together
        self.vocode_threads: set[str] = set()
        self.aborts_made = 0  # vocode_abort calls
        self.aborts_given = 0  # vocode calls given an abort handle
        self.prepares = 0  # prepare_segment calls
        self.drops = 0  # drop_prepared calls

    def prepare_segment(self, request: TalkRequest) -> Future[Any] | None:
        with self._lock:
            self.prepares += 1
        return None  # nothing started: open_segment does the (cheap) work

    def drop_prepared(self) -> None:
        self.drops += 1

    def vocode_abort(self) -> AbortHandle:
        self.aborts_made += 1
        return threading.Event().set

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        with self._lock:
            self._running += 1
            self.calls_at_once = max(self.calls_at_once, self._running)
            self.vocode_threads.add(threading.current_thread().name)
            self.aborts_given += abort is not None
        try:
            return super().vocode(items)
        finally:
            with self._lock:
                self._running -= 1


def _sim_costs() -> dict[str, Any]:
    return {f.name: getattr(FAST_SIM, f.name) for f in fields(FAST_SIM)}


def _build_tiny(config: TinyConfig, context: BackendContext) -> Backend:
    assert isinstance(context.talker, TalkerConfig)
    assert isinstance(context.vocoder, VocoderConfig)
    return TinyBackend(config)


@pytest.fixture
def tiny() -> Iterator[BackendEntry]:
    entry = register(BackendEntry("tiny", TinyConfig, _build_tiny))
    yield entry
    unregister("tiny")


def _check(pcm: np.ndarray, text: str) -> None:
    pairs = decode_sim_signal(pcm, FAST_SIM.samples_per_frame)
    assert [index for _, index in pairs] == list(range(expected_frames(text)))
    assert len({tag for tag, _ in pairs}) == 1


async def test_a_registered_backend_serves_a_stream_end_to_end(
    tiny: BackendEntry, make_engine: EngineFactory
) -> None:
    backend = build_backend(BackendConfig(kind="tiny"), TinyConfig())
    assert isinstance(backend, TinyBackend) and isinstance(backend, Backend)
    assert backend.capabilities == BackendCapabilities()
    engine = await make_engine(backend)
    stream = engine.submit(TEXT, voice="sim")
    _check(await read_all(stream), TEXT)
    assert backend.open_segments == 0
    assert len(engine.book) == 0


async def _serve(
    make_engine: EngineFactory, claimed: tuple[str, ...], texts: Sequence[str]
) -> tuple[TinyBackend, Any]:
    backend = build_backend("tiny", TinyConfig(capabilities=claimed, vocoder_base_ms=4.0))
    assert isinstance(backend, TinyBackend)
    engine = await make_engine(
        backend,
        window=1,
        vocoder=VocoderConfig(workers=2),
        alone=AloneConfig(work_ahead=True, prepare_next=True),
        talker=TalkerConfig(high_water_s=3600.0, batch=8, urgent_lane=True),
    )
    streams = [engine.submit(text, voice="sim") for text in texts]
    pcms = await asyncio.gather(*(read_all(stream) for stream in streams))
    for pcm, text in zip(pcms, texts, strict=True):
        _check(pcm, text)
    return backend, engine


@pytest.mark.parametrize("on", [False, True])
async def test_vocode_abort_only_where_claimed(
    tiny: BackendEntry, make_engine: EngineFactory, on: bool
) -> None:
    """A lone stream's calls decode one stream each: they get an abort handle where the
    backend claims aborts_vocode, and vocode_abort is never called where it does not."""
    backend, _ = await _serve(make_engine, ("aborts_vocode",) if on else (), [TEXT])
    if on:
        assert backend.aborts_made > 0 and backend.aborts_given == backend.aborts_made
    else:
        assert backend.aborts_made == 0 and backend.aborts_given == 0


@pytest.mark.parametrize("on", [False, True])
async def test_vocoder_workers_only_where_vocode_calls_may_overlap(
    tiny: BackendEntry, make_engine: EngineFactory, on: bool
) -> None:
    """vocoder.workers 2: two workers decode side by side where the backend claims
    concurrent_vocode_calls; one worker (one call at a time) where it does not."""
    backend, engine = await _serve(make_engine, ("concurrent_vocode_calls",) if on else (), TEXTS)
    if on:
        assert len(engine.extra_vocoder_stages) == 1
        assert len(backend.vocode_threads) == 2
    else:
        assert engine.extra_vocoder_stages == []
        assert backend.calls_at_once == 1 and len(backend.vocode_threads) == 1


@pytest.mark.parametrize("on", [False, True])
async def test_segments_are_prepared_only_where_claimed(
    tiny: BackendEntry, make_engine: EngineFactory, on: bool
) -> None:
    """alone.prepare_next, a lone stream of three sentences: its next segment
    is handed to prepare_segment only where the backend claims prepares_segments."""
    backend, engine = await _serve(make_engine, ("prepares_segments",) if on else (), [TEXT])
    if on:
        assert backend.prepares > 0 and engine.book.talker.prepares == backend.prepares
    else:
        assert backend.prepares == 0 and backend.drops == 0 and engine.book.talker.prepares == 0


@pytest.mark.parametrize("on", [False, True])
async def test_a_second_talker_lane_only_where_steps_may_overlap(
    tiny: BackendEntry, make_engine: EngineFactory, on: bool
) -> None:
    _, engine = await _serve(make_engine, ("concurrent_talker_steps",) if on else (), [TEXT])
    assert (engine.urgent_stage is not None) == on


def test_the_kinds_are_the_registered_ones(tiny: BackendEntry) -> None:
    assert backend_kinds() == ("sim", "piper", "kokoro", "multi", "codec_lm", "gpu_model", "tiny")
    assert BackendConfig(kind="tiny").kind == "tiny"
    message = "kind must be one of sim, piper, kokoro, multi, codec_lm, gpu_model, tiny, got 'gpu'"
    with pytest.raises(ConfigError, match=message):
        BackendConfig(kind="gpu")
    with pytest.raises(ConfigError, match=message):
        build_backend("gpu")
    unregister("tiny")
    try:
        message = "one of sim, piper, kokoro, multi, codec_lm, gpu_model, got 'tiny'"
        with pytest.raises(ConfigError, match=message):
            BackendConfig(kind="tiny")
    finally:
        register(tiny)


def test_the_registry_refuses_what_it_cannot_serve(tiny: BackendEntry) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(BackendEntry("tiny", TinyConfig, _build_tiny))
    with pytest.raises(ValueError, match="lower case"):
        BackendEntry("Tiny-2", TinyConfig, _build_tiny)
    with pytest.raises(ValueError, match="lower case"):
        BackendEntry("tiny__2", TinyConfig, _build_tiny)
    with pytest.raises(TypeError, match="dataclass"):
        BackendEntry("tiny2", dict, _build_tiny)
    with pytest.raises(TypeError, match="reads a TinyConfig, got SimConfig"):
        build_backend("tiny", SimConfig())
    with pytest.raises(KeyError):
        unregister("never")
    with pytest.raises(ConfigError, match="unknown"):
        TinyConfig(capabilities=("teleports",))


class _ClaimsAbort(SimBackend):
    """Claims aborts_vocode, but keeps Backend's default vocode_abort."""

    capabilities = BackendCapabilities(aborts_vocode=True)


class _NoCapabilities:
    """Every required call, but no capabilities."""

    def __init__(self) -> None:
        self._sim = SimBackend(FAST_SIM)

    name = "bare"
    samples_per_frame = FAST_SIM.samples_per_frame
    sample_rate_hz = FAST_SIM.sample_rate_hz

    def voices(self) -> list[Any]:
        return self._sim.voices()

    def default_voice(self) -> str:
        return self._sim.default_voice()

    def open_segment(self, request: TalkRequest) -> SimSegment:
        return self._sim.open_segment(request)

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        return self._sim.step(segments)

    def close_segment(self, segment: SimSegment) -> None:
        self._sim.close_segment(segment)

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        return self._sim.vocode(items)

    def close(self) -> None:
        self._sim.close()


async def test_a_backend_must_declare_what_it_claims(make_engine: EngineFactory) -> None:
    with pytest.raises(TypeError, match="claims aborts_vocode but does not define vocode_abort"):
        await make_engine(_ClaimsAbort(FAST_SIM))
    with pytest.raises(TypeError, match="declares no capabilities"):
        backend_capabilities(_NoCapabilities())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a BackendCapabilities"):
        backend_capabilities(type("_Yes", (_NoCapabilities,), {"capabilities": True})())
    with pytest.raises(TypeError, match="must be a bool"):
        BackendCapabilities(aborts_vocode=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="abstract"):
        type("_NoStep", (Backend,), {})()
    register(BackendEntry("claims", TinyConfig, lambda config, context: _ClaimsAbort(FAST_SIM)))
    try:
        with pytest.raises(TypeError, match="claims aborts_vocode"):
            build_backend("claims")
    finally:
        unregister("claims")


def test_the_settings_have_a_section_per_registered_kind(tiny: BackendEntry) -> None:
    """Every kind registered before app.settings was imported has its YAML section, read by
    its configuration class; one registered later is refused by name."""
    assert {"piper", "sim", "kokoro", "codec_lm"} <= set(SECTIONS)
    assert Settings.model_fields["sim"].annotation is SimConfig
    settings = load_settings(None, ["backend.kind=sim", "sim.samples_per_frame=480"], environ={})
    assert settings.backend_config() == SimConfig(samples_per_frame=480)
    backend = build_backend(settings.backend, settings.backend_config())
    assert backend.samples_per_frame == 480
    with pytest.raises(
        SettingsError,
        match=r"--set: backend\.kind: kind must be one of sim, piper, kokoro, multi, codec_lm, "
        r"gpu_model, tiny, got",
    ):
        load_settings(None, ["backend.kind=gpu"], environ={})
    with pytest.raises(SettingsError, match=r"backend\.kind tiny: registered after the settings"):
        load_settings(None, ["backend.kind=tiny"], environ={})


def test_importing_pipeline_and_settings_loads_no_model_runtime() -> None:
    """The registry imports configuration classes only: ONNX Runtime and torch load when
    their backend is built."""
    script = textwrap.dedent(
        """
        import sys
        import pipeline
        from app.settings import load_settings
        from pipeline import build_backend
        settings = load_settings(None, ["backend.kind=sim"], environ={})
        build_backend(settings.backend, settings.backend_config()).close()
        heavy = sorted({"onnxruntime", "torch", "transformers"} & set(sys.modules))
        assert not heavy, heavy
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
