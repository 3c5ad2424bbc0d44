"""The engine's start-up calibration (Engine.calibrate): internal streams run through both
stages at once, saturating them; each stage's rate from its calls' costs, paid under that
full contention, at most the audio put out per wall second meanwhile, seeds the capacity
model's saturated reading (pipeline/capacity.py).

`measure` is given the parts it runs (`CalibrationRun`), not the Engine: the engine
imports this module, and this module imports none of the engine's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.backend import Voice
from pipeline.book import StreamBook
from pipeline.events import GuardedEvents
from pipeline.stream import Stream
from pipeline.talker import Talker
from pipeline.vocoder import Vocoder
from scheduling.voice_cost import VoiceCosts

log = logging.getLogger("playhead.engine")

# What the calibration speaks: plain sentences of ordinary length.
CALIBRATION_TEXT = (
    "The morning train was late again, so we walked along the river instead. "
    "By the time we reached the bridge, the fog had lifted and the city was awake. "
    "Nobody seemed to mind the delay; there was coffee, and the light was lovely."
)
# ... in the voice's language where it has one here (a Japanese voice reading the English
# text above spoke it as one 12 s segment whose first decode outlasted the calibration)
CALIBRATION_TEXTS = {
    "ja": (
        "朝の電車はまた遅れていたので、川沿いを歩くことにしました。"
        "橋に着くころには霧も晴れて、街は目を覚ましていました。"
        "誰も遅れを気にしていないようでした。コーヒーがあって、光がきれいでした。"
    ),
}


def calibration_text(language: str) -> str:
    """What a voice of `language` ("ja", "en-US") speaks in a calibration."""
    return CALIBRATION_TEXTS.get(language.split("-")[0].lower(), CALIBRATION_TEXT)


async def _read_out(stream: Stream) -> None:
    """Read a stream's audio as fast as it comes (a calibration stream's reader)."""
    async for _ in stream.chunks():
        pass


@dataclass(frozen=True)
class CalibrationRun:
    """What one calibration runs on and for how long (Engine.calibrate builds it)."""

    book: StreamBook
    talker: Talker
    vocoder: Vocoder
    voice: Voice  # the voice it speaks (its backend's default)
    count: int  # calibration streams, at once
    ramp_turns: int  # the first vocoder turns (the chunk ramp): run, not measured
    calls: int  # vocoder turns measured (engine.calibration_calls)
    max_s: float  # at most this long (engine.calibration_max_s)
    clock: Callable[[], float]
    current: Callable[[], object]  # the engine's running calibration (a submit ends it)
    capacity: Callable[[float], float]  # the engine's capacity at a time
    # the voice's cost against the reference voice's now (the stages record its audio
    # times this: scheduling/voice_cost.py), so the audio out is read in the same unit
    cost: float = 1.0


async def measure(run: CalibrationRun, streams: list[Stream]) -> float | None:
    """Engine.calibrate's measurement: see there. Returns the calibrated capacity, None
    when nothing was measured (a submit ended it, or no vocoder turn ran)."""
    loop = asyncio.get_running_loop()
    book, talker, vocoder = run.book, run.talker, run.vocoder
    turns_before = vocoder.turns
    for rate in (vocoder.rate, talker.rate):
        rate.set_baseline(0.0)  # measure afresh
    started_s = loop.time()

    def running() -> bool:
        return run.current() is streams and loop.time() - started_s < run.max_s

    now_s = run.clock()
    text = calibration_text(run.voice.language)
    for _ in range(run.count):
        stream = book.add_stream(run.voice, speed=1.0, now_s=now_s)
        book.add_text(stream.id, text, final=True)
        streams.append(stream)
    readers = [asyncio.ensure_future(_read_out(stream)) for stream in streams]
    try:
        while (
            running()
            and vocoder.turns - turns_before < run.ramp_turns
            and not all(reader.done() for reader in readers)
        ):
            await asyncio.sleep(0.005)
        vocoder.rate.reset()
        talker.rate.reset()
        turns_before = vocoder.turns
        measured_from_s = run.clock()
        audio_before_s = sum(stream.stats.audio_s for stream in streams)
        while (
            running()
            and vocoder.turns - turns_before < run.calls
            and not all(reader.done() for reader in readers)
        ):
            await asyncio.sleep(0.005)
        # what the pipeline sustained, saturated: audio out per wall second
        measured_s = run.clock() - measured_from_s
        audio_s = sum(stream.stats.audio_s for stream in streams) - audio_before_s
        sustained = audio_s * run.cost / measured_s if measured_s > 0 else 0.0
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    if run.current() is not streams:  # a submit ended it
        return None
    for stream in streams:
        book.cancel(stream.id)
    # the talker closes the calibration's open segments (orphans), and the vocoder's
    # turn in flight ends, before anything is reported again. Not "until the vocoder
    # waits once more": when every calibration stream had ended already, it was
    # waiting before this point and nothing wakes it, so that waited out
    # calibration_max_s (5 s at start-up, in about 2% of starts on the sim backend)
    while running() and (
        book.talker.has_orphans or talker.lanes_busy or book.vocoder.turns_running
    ):
        await asyncio.sleep(0.002)
    if run.current() is not streams or vocoder.turns == turns_before:
        return None
    # Each stage's rate from its calls' costs, all paid under the full contention of a
    # saturated pipeline, and at most the audio the pipeline put out per wall second
    # meanwhile (never above what it sustained), seeds its saturated reading; busy
    # periods refresh it (pipeline/capacity.py). On a shared 2-core machine the first
    # read 0.7-1.3 C and the second about 0.55 C (the calibration's streams start
    # together: their first sentences hold the vocoder back for a part of it).
    now_s = run.clock()
    for rate in (vocoder.rate, talker.rate):
        cost = rate.cost_s_per_audio_s(now_s)
        model = rate.workers / cost if cost else 0.0
        rate.set_baseline(min(model, sustained) if sustained > 0 else model)
    capacity = run.capacity(now_s)
    log.info(
        "calibrated %s in %.2f s: vocoder %.1f, talker %.1f audio s/s; capacity %.1f streams "
        "at 1x (audio out meanwhile %.1f audio s/s)",
        run.voice.id,
        loop.time() - started_s,
        vocoder.rate.baseline,
        talker.rate.baseline,
        capacity,
        sustained,
    )
    return capacity


async def measure_groups(
    run_for: Callable[[str], CalibrationRun], costs: VoiceCosts, streams: list[Stream]
) -> float | None:
    """Each backend (voice group) calibrated alone in turn, the reference (the default
    voice's) last: its run is the one the capacity model keeps; the others give their
    costs against it (`costs.set_capacities`). Returns the reference's calibrated
    capacity; None when nothing was measured or a submit ended it."""
    capacities: dict[str, float] = {}
    measured = None
    for group in costs.groups:
        run = run_for(group)
        measured = await measure(run, streams)
        if run.current() is not streams:  # a submit ended it
            return None
        streams.clear()  # measure cancelled them
        if measured is not None:  # read in reference seconds at the group's cost then
            capacities[group] = measured / costs.group_cost(group)
    if measured is not None:
        costs.set_capacities(capacities)
        if len(capacities) > 1:
            log.info(
                "costs per audio second against %s: %s",
                costs.reference,
                ", ".join(f"{g} {costs.group_cost(g):.2f}" for g in costs.groups),
            )
    return measured


def end_calibration(book: StreamBook, events: GuardedEvents, streams: list[Stream]) -> None:
    """Cancel a calibration's streams (not reported), forget their first audio (they
    start all at once: nothing admission's first-audio bound should subtract) and
    report events again."""
    events.muted = True
    for stream in streams:
        book.cancel(stream.id)
    book.table.first_audio.clear()
    events.muted = False
