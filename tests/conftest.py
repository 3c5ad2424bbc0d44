"""Shared fixtures: a fast sim backend and an engine factory that always stops its engines."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import numpy as np
import pytest

from pipeline.backend import Backend
from pipeline.backends.sim import SimBackend
from pipeline.config import (
    AloneConfig,
    EngineConfig,
    SimConfig,
    TalkerConfig,
    TextConfig,
    VocoderConfig,
)
from pipeline.engine import Engine, EngineEvents
from pipeline.stream import Stream
from scheduling import AdmissionConfig, ChunkingConfig, SchedulingConfig

# Costs small enough that a test's engine runs far faster than real time.
FAST_SIM = SimConfig(
    talker_frames_per_step=4,
    talker_step_base_ms=0.6,
    talker_step_per_stream_ms=0.2,
    vocoder_base_ms=1.0,
    vocoder_per_frame_ms=0.2,
)
TEST_CHUNKING = ChunkingConfig(
    chunk_frames=8, ramp=(4,), left_context_frames=2, right_context_frames=2
)

EngineFactory = Callable[..., Awaitable[Engine]]


@pytest.fixture(autouse=True, scope="session")
def _jobs_data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every app a test starts keeps its jobs (app/jobs/, `jobs.dir` null: under
    $XDG_DATA_HOME) in this session's temporary directory, never the user's."""
    saved = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("data-home"))
    yield
    if saved is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = saved


async def read_all(stream: Stream) -> np.ndarray:
    """Every PCM chunk of a stream, joined (an empty array for a stream with no audio)."""
    parts = [pcm async for pcm in stream.chunks()]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait for a condition the engine reaches on its own (a test-side bound)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    """`await make_engine(backend=None, policy="edf", window=2, ...)`: a started engine."""
    engines: list[Engine] = []

    async def make(
        backend: Backend | None = None,
        *,
        policy: str = "edf",
        window: int = 2,
        chunking: ChunkingConfig = TEST_CHUNKING,
        admission: AdmissionConfig | None = None,
        engine: EngineConfig | None = None,
        talker: TalkerConfig | None = None,
        text: TextConfig | None = None,
        events: EngineEvents | None = None,
        vocoder: VocoderConfig | None = None,
        alone: AloneConfig | None = None,
    ) -> Engine:
        built = Engine(
            backend or SimBackend(FAST_SIM),
            scheduling=SchedulingConfig(policy=policy, active_stream_window=window),
            chunking=chunking,
            admission=admission or AdmissionConfig(enabled=False),
            # no start-up calibration unless a test asks: tags and call logs start at 1
            engine=engine or EngineConfig(calibration_calls=0),
            # no high-water wait by default: tests run far faster than real time
            talker=talker or TalkerConfig(high_water_s=3600.0),
            text=text or TextConfig(),
            vocoder=vocoder or VocoderConfig(),
            alone=alone or AloneConfig(),
            events=events,
        )
        await built.start()
        engines.append(built)
        return built

    yield make
    for built in engines:
        await built.stop()
