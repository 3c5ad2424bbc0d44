"""The vocoder's urgent lane (`vocoder.urgent_lane`, pipeline/vocoder.py): while a worker's
decode runs on (it cannot be cut short: a Kokoro chunk is a whole segment's decode), a new
stream's first chunk goes at once on the lane, and every frame still arrives once, in
order. The workers' stage threads run at a lower OS priority (`vocoder.bulk_nice`)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from conftest import FAST_SIM, EngineFactory, read_all, until

from pipeline.backend import AbortHandle, BackendCapabilities, VocodeItem
from pipeline.backends.sim import SimBackend, decode_sim_signal, expected_frames
from pipeline.config import SimConfig, TalkerConfig, VocoderConfig
from pipeline.executor import StageExecutor
from scheduling import ConfigError

LONG = " ".join(f"Sentence {i} of the first stream goes on for a while here." for i in range(12))
SHORT = "A new stream starts now."


class LaneSim(SimBackend):
    """Overlapping vocode calls; a call of a worker (not the lane) on stream 1 waits for
    `release` while `hold` is set; notes the threads and priorities of calls."""

    capabilities = BackendCapabilities(concurrent_vocode_calls=True)

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.hold = threading.Event()
        self.release = threading.Event()
        self.holding = 0
        self.threads: dict[str, int] = {}  # thread name prefix -> its nice value

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        name = threading.current_thread().name.rsplit("_", 1)[0]
        self.threads[name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        first_stream = any(len(item.frames) and int(item.frames[0, 0]) == 1 for item in items)
        if self.hold.is_set() and first_stream and not name.endswith("urgent"):
            self.holding += 1
            self.release.wait(10.0)
            self.holding -= 1
        return super().vocode(items, abort)


def _check(pcm: np.ndarray, text: str) -> None:
    pairs = decode_sim_signal(pcm, FAST_SIM.samples_per_frame)
    assert [index for _, index in pairs] == list(range(expected_frames(text)))


@pytest.mark.parametrize("lane", [True, False])
async def test_a_first_chunk_does_not_wait_for_a_workers_decode(
    make_engine: EngineFactory, lane: bool
) -> None:
    """Stream 1 plays with audio buffered; a worker's decode of it is held. Stream 2's first
    chunk is decoded meanwhile on the urgent lane; with no lane it waits for the release.
    Both streams' frames arrive once, in order; the worker ran at the lower priority."""
    backend = LaneSim(FAST_SIM)
    engine = await make_engine(
        backend,
        window=1,
        vocoder=VocoderConfig(workers=1, urgent_lane=lane, urgent_lane_slack_s=0.05, bulk_nice=3),
        talker=TalkerConfig(high_water_s=3600.0, urgent_lane=False),
    )
    playing = engine.submit(LONG, voice="sim")  # tag 1
    reader = asyncio.create_task(read_all(playing))

    def slack_s() -> float:
        slack = engine.book.scheduler.slack_s(playing.id, engine._clock())
        return -1.0 if slack is None else slack

    await until(lambda: slack_s() > 0.5)
    backend.hold.set()
    await until(lambda: backend.holding == 1)
    second = engine.submit(SHORT, voice="sim")  # tag 2
    second_reader = asyncio.create_task(read_all(second))
    if lane:
        await until(lambda: second.stats.ttfa_s is not None, timeout_s=2.0)
        assert backend.holding == 1  # the worker's decode still runs
        assert engine.book.vocoder.lane_turns >= 1
    else:
        await asyncio.sleep(0.2)
        assert second.stats.ttfa_s is None
    backend.release.set()
    backend.hold.clear()
    _check(await reader, LONG)
    _check(await second_reader, SHORT)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    # (a test run at nice 19 sees 19 everywhere: no lower priority exists)
    assert backend.threads["playhead-vocoder"] == min(base + (3 if lane else 0), 19)
    if lane:
        assert backend.threads["playhead-vocoder-urgent"] == base
    assert len(engine.book) == 0


async def test_a_stage_runs_at_its_lower_priority() -> None:
    stage = StageExecutor("nice-test", nice=4)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = await stage.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    await stage.aclose()
    assert seen == min(base + 4, 19)
    with pytest.raises(ValueError, match="nice"):
        StageExecutor("bad", nice=20)


def test_the_lane_knobs_are_validated() -> None:
    with pytest.raises(ConfigError, match="bulk_nice"):
        VocoderConfig(bulk_nice=20)
    with pytest.raises(ConfigError, match="urgent_lane_slack_s"):
        VocoderConfig(urgent_lane_slack_s=-1.0)
    with pytest.raises(ConfigError, match="urgent_lane"):
        VocoderConfig(urgent_lane="yes")  # type: ignore[arg-type]
