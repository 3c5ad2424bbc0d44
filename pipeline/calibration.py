"""The engine's start-up calibration (Engine.calibrate): internal streams run through both
stages at once, saturating them; each stage's rate from its calls' costs, paid under that
full contention, at most the audio put out per wall second meanwhile, seeds the capacity
model's saturated reading (pipeline/capacity.py)."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.engine import Engine
    from pipeline.stream import Stream

log = logging.getLogger("playhead.engine")

# What the calibration speaks: plain sentences of ordinary length.
CALIBRATION_TEXT = (
    "The morning train was late again, so we walked along the river instead. "
    "By the time we reached the bridge, the fog had lifted and the city was awake. "
    "Nobody seemed to mind the delay; there was coffee, and the light was lovely."
)


async def _read_out(stream: Stream) -> None:
    """Read a stream's audio as fast as it comes (a calibration stream's reader)."""
    async for _ in stream.chunks():
        pass


async def measure(engine: Engine, streams: list[Stream]) -> float:
    """Engine.calibrate's measurement: see there. Returns the calibrated capacity."""
    config = engine._config
    loop = asyncio.get_running_loop()
    book = engine.book
    voice = engine.resolve_voice(engine._backend.default_voice())
    count = max(2, engine._scheduling.active_stream_window, min(engine._talker_config.batch, 16))
    turns_before = engine.vocoder.turns
    for rate in (engine.vocoder.rate, engine.talker.rate):
        rate.set_baseline(0.0)  # measure afresh
    started_s = loop.time()

    def running() -> bool:
        return engine._calibration is streams and loop.time() - started_s < config.calibration_max_s

    now_s = engine._clock()
    for _ in range(count):
        stream = book.add_stream(voice, speed=1.0, now_s=now_s)
        book.add_text(stream.id, CALIBRATION_TEXT, final=True)
        streams.append(stream)
    readers = [asyncio.ensure_future(_read_out(stream)) for stream in streams]
    # the first chunks of a stream are small (the ramp): a loaded server decodes
    # steady chunks, so the turns of the ramp are run but not measured
    window = max(1, engine._scheduling.active_stream_window)
    ramp_turns = math.ceil(count * max(1, len(engine._chunking.ramp)) / window)
    try:
        while (
            running()
            and engine.vocoder.turns - turns_before < ramp_turns
            and not all(reader.done() for reader in readers)
        ):
            await asyncio.sleep(0.005)
        engine.vocoder.rate.reset()
        engine.talker.rate.reset()
        turns_before = engine.vocoder.turns
        measured_from_s = engine._clock()
        audio_before_s = sum(stream.stats.audio_s for stream in streams)
        while (
            running()
            and engine.vocoder.turns - turns_before < config.calibration_calls
            and not all(reader.done() for reader in readers)
        ):
            await asyncio.sleep(0.005)
        # what the pipeline sustained, saturated: audio out per wall second
        measured_s = engine._clock() - measured_from_s
        audio_s = sum(stream.stats.audio_s for stream in streams) - audio_before_s
        sustained = audio_s / measured_s if measured_s > 0 else 0.0
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    if engine._calibration is not streams:  # a submit ended it
        return engine.calibrated_capacity
    for stream in streams:
        book.cancel(stream.id)
    # the talker closes the calibration's open segments (orphans), and the vocoder's
    # turn in flight ends, before anything is reported again. Not "until the vocoder
    # waits once more": when every calibration stream had ended already, it was
    # waiting before this point and nothing wakes it, so that waited out
    # calibration_max_s (5 s at start-up, in about 2% of starts on the sim backend)
    while running() and (
        book.talker.has_orphans or engine.talker.lanes_busy or book.vocoder.turns_running
    ):
        await asyncio.sleep(0.002)
    if engine._calibration is not streams or engine.vocoder.turns == turns_before:
        return engine.calibrated_capacity
    # Each stage's rate from its calls' costs, all paid under the full contention of a
    # saturated pipeline, and at most the audio the pipeline put out per wall second
    # meanwhile (never above what it sustained), seeds its saturated reading; busy
    # periods refresh it (pipeline/capacity.py). On a shared 2-core machine the first
    # read 0.7-1.3 C and the second about 0.55 C (the calibration's streams start
    # together: their first sentences hold the vocoder back for a part of it).
    now_s = engine._clock()
    for rate in (engine.vocoder.rate, engine.talker.rate):
        cost = rate.cost_s_per_audio_s(now_s)
        model = rate.workers / cost if cost else 0.0
        rate.set_baseline(min(model, sustained) if sustained > 0 else model)
    engine.calibrated_capacity = engine.capacity(now_s)
    engine.calibrations += 1
    log.info(
        "calibrated in %.2f s: vocoder %.1f, talker %.1f audio s/s; capacity %.1f streams "
        "at 1x (audio out meanwhile %.1f audio s/s)",
        loop.time() - started_s,
        engine.vocoder.rate.baseline,
        engine.talker.rate.baseline,
        engine.calibrated_capacity,
        sustained,
    )
    return engine.calibrated_capacity
