"""The capacity model's reading against what the machine sustains, in one run.

In-process (no HTTP: the figures are the engine's), on a config's backend:

1. saturated: `--saturate` clients (default 20) read long requests as fast as they come,
   admission off; the audio the engine produced for them from `--warmup` to the end of
   `--seconds`, per second, is the capacity C the machine sustained in this run;
2. for each load in 0.25, 0.5, 0.9 and 1.5 C: round(load x C) clients each play their
   stream at 1x (a player that reads at most `--lead` seconds ahead of real time, so
   the server is paced as by real listeners) and start the next request when it ends,
   admission off (the load is what is set, over capacity too); `Engine.capacity()` is
   sampled every 0.2 s after the warm-up;
3. printed: the calibration, C, and per load the model's reading (median, min, max) as
   a share of C. A reading above 1.0 would let admission take more than the machine
   sustains; one far below it refuses work the machine could do.

`--sequential N` instead sends N requests of ~10 s audio one after another, each read
to its end before the next, admission ON as configured, and prints how many were
admitted (the issue: 26 of 50 on the default voice, 7 of 50 on configs/sim.yaml, before
admission counted the work owed).

    python -m benchmarks.capacity_model [--config configs/default.yaml] [--seconds 20]
    python -m benchmarks.capacity_model --config configs/sim.yaml --sequential 50

A quiet machine gives the figures; on a shared one (other processes on its cores) both C
and the readings move with the neighbours.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
from pathlib import Path

from app.settings import Settings, load_settings
from pipeline import Engine, Rejected, Stream
from pipeline.backends import build_backend

LONG = (
    "The morning train was late again, so we walked along the river instead. "
    "By the time we reached the bridge, the fog had lifted and the city was awake. "
) * 3
TEN_SECONDS = "The quick brown fox jumps over the lazy dog near the quiet river bank. " * 2
LOADS = (0.25, 0.5, 0.9, 1.5)


async def _engine(settings: Settings, *, admission: bool) -> Engine:
    s = settings
    backend = build_backend(s.backend, s.backend_config(), talker=s.talker, vocoder=s.vocoder)
    engine = Engine(
        backend,
        scheduling=s.scheduling,
        chunking=s.chunking,
        admission=dataclasses.replace(s.admission, enabled=admission),
        engine=s.engine,
        talker=s.talker,
        text=s.text,
        vocoder=s.vocoder,
        alone=s.alone,
    )
    await engine.start()
    return engine


class _Produced:
    """Audio the engine sent to every client's stream from `from_s` on (its streams'
    own `stats.audio_s`: what the pipeline produced, whenever the client reads it)."""

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.baseline: dict[str, float] | None = None

    def snapshot(self) -> None:
        self.baseline = {stream.id: stream.stats.audio_s for stream in self.streams}

    def audio_s(self) -> float:
        baseline = self.baseline or {}
        return sum(s.stats.audio_s - baseline.get(s.id, 0.0) for s in self.streams)


def load_text(path: str | None, chars: int) -> str:
    """The load's request text: LONG, or a corpus file's lines (not # comments) joined
    up to about `chars` characters (a Japanese voice's corpus: benchmarks/corpus-ja.txt)."""
    if path is None:
        return LONG
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    text = ""
    for line in lines:
        if line and not line.startswith("#") and len(text) < chars:
            text += line
    return text


async def _client(
    engine: Engine,
    voice: str,
    produced: _Produced,
    until_s: float,
    paced: bool,
    lead_s: float,
    text: str = LONG,
) -> None:
    rate_hz = engine.resolve_voice(voice).sample_rate_hz
    while time.monotonic() < until_s:
        stream = engine.submit(text, voice=voice)
        produced.streams.append(stream)
        started_s = time.monotonic()
        played_s = 0.0
        try:
            async for pcm in stream.chunks():
                now_s = time.monotonic()
                played_s += pcm.size / rate_hz
                if paced:  # a 1x player: read at most lead_s ahead of its playback
                    ahead_s = played_s - (now_s - started_s) - lead_s
                    if ahead_s > 0:
                        await asyncio.sleep(ahead_s)
                if now_s >= until_s:
                    break
        finally:
            engine.cancel(stream.id)


async def _run_load(
    engine: Engine, voice: str, clients: int, seconds: float, warmup_s: float, **kw: object
) -> tuple[float, list[float]]:
    """(audio produced per second after the warm-up, capacity readings meanwhile)."""
    produced = _Produced()
    started_s = time.monotonic()
    until_s = started_s + seconds
    tasks = [
        asyncio.ensure_future(_client(engine, voice, produced, until_s, **kw))  # type: ignore[arg-type]
        for _ in range(clients)
    ]
    await asyncio.sleep(warmup_s)
    produced.snapshot()
    measured_from_s = time.monotonic()
    readings: list[float] = []
    while time.monotonic() < until_s:
        await asyncio.sleep(0.2)
        readings.append(engine.capacity())
    audio_s = produced.audio_s()
    measured_s = time.monotonic() - measured_from_s
    await asyncio.gather(*tasks, return_exceptions=True)
    await engine.wait_idle()
    return audio_s / measured_s, readings


async def _capacity(settings: Settings, args: argparse.Namespace) -> None:
    engine = await _engine(settings, admission=False)
    try:
        voice = args.voice or engine.backend.default_voice()
        text = load_text(args.text_file, args.text_chars)
        print(
            f"{args.config}: calibrated {engine.calibrated_capacity:.2f} audio s/s "
            f"(model now {engine.capacity():.2f})"
        )
        sustained, readings = await _run_load(
            engine,
            voice,
            args.saturate,
            args.seconds,
            args.warmup,
            paced=False,
            lead_s=0.0,
            text=text,
        )
        print(
            f"saturated ({args.saturate} clients reading as fast as they can): C = "
            f"{sustained:.2f} audio s/s; model meanwhile median "
            f"{statistics.median(readings):.2f} ({statistics.median(readings) / sustained:.2f} C)"
        )
        print("load   clients  produced/C  reading/C median [min, max]")
        loads = [float(x) for x in args.loads.split(",")] if args.loads else LOADS
        for load in loads:
            clients = max(1, round(load * sustained))
            received, readings = await _run_load(
                engine,
                voice,
                clients,
                args.seconds,
                args.warmup,
                paced=True,
                lead_s=args.lead,
                text=text,
            )
            ratios = [r / sustained for r in readings] or [float("nan")]
            print(
                f"{load:4.2f} C  {clients:7d}  {received / sustained:10.2f}  "
                f"{statistics.median(ratios):6.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
            )
    finally:
        await engine.stop()


async def _sequential(settings: Settings, count: int) -> None:
    engine = await _engine(settings, admission=True)
    try:
        voice = engine.backend.default_voice()
        statuses: list[str] = []
        audio_s = 0.0
        rate_hz = engine.resolve_voice(voice).sample_rate_hz
        for _ in range(count):
            try:
                reservation = engine.reserve()
                await reservation.wait_start()
            except Rejected as exc:
                statuses.append(f"429 ({exc.decision.reason}, Retry-After {exc.retry_after_s})")
                continue
            stream = engine.submit(TEN_SECONDS, voice=voice, reservation=reservation)
            async for pcm in stream.chunks():
                audio_s += pcm.size / rate_hz
            statuses.append("200")
        ok = statuses.count("200")
        print(
            f"sequential: {ok} x 200, {count - ok} refused, of {count} "
            f"(~{audio_s / max(ok, 1):.1f} s of audio each)"
        )
        for status in sorted(set(statuses) - {"200"}):
            print(f"  {statuses.count(status)} x {status}")
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--seconds", type=float, default=20.0, help="each load's length")
    parser.add_argument("--warmup", type=float, default=5.0, help="not counted, each load")
    parser.add_argument("--saturate", type=int, default=20, help="clients for C")
    parser.add_argument("--lead", type=float, default=2.0, help="a 1x player's read-ahead")
    parser.add_argument("--sequential", type=int, default=0, help="N one after another")
    parser.add_argument("--voice", default=None, help="the load's voice (default: the config's)")
    parser.add_argument("--text-file", default=None, help="load text: a corpus file's lines")
    parser.add_argument("--text-chars", type=int, default=160, help="... joined to about this")
    parser.add_argument("--loads", default=None, help="loads in C, comma-separated")
    args = parser.parse_args()
    settings = load_settings(args.config, args.overrides, environ={})
    if args.sequential:
        asyncio.run(_sequential(settings, args.sequential))
    else:
        asyncio.run(_capacity(settings, args))


if __name__ == "__main__":
    main()
