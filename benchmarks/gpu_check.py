"""GPU check of the codec-LM backend: talker step time per batch, vocoder turn time per K,
and the largest number of streams held stall-free through the Engine.

    python -m benchmarks.gpu_check --config configs/codec-lm-1b-random.yaml

Loads the model the config names on its device (tiny, full-size random, or a checkpoint),
then prints three tables:
1. talker step (ms) at batch 1, 8, 32, 64: `backend.step` over B open segments, median of
   `--steps` steps after a warm-up (the joiners' prompt step is timed apart);
2. vocoder turn (ms) per K: one batched Mimi call of K chunks of chunk_frames frames plus
   the left context;
3. closed loop through the Engine for N = 1, 8, 32, 64 concurrent streams (each client
   starts its next request when one ends), each client played by benchmarks/player.py's 1x
   player, for `--duration-s` each: stall-free share, TTFA p50/p99; the largest N with
   >= 99% stall-free streams and TTFA p99 <= 1 s.
Every measurement is bounded in steps or seconds, so the whole run has a known length.

Imports only pipeline/, scheduling/, benchmarks/player.py and yaml (no app/, pydantic, av).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.player import DEFAULT_SLO_S, STALL_TOLERANCE_S, Player, percentile
from pipeline.backend import TalkRequest, VocodeItem
from pipeline.config import BackendConfig, CodecLMConfig, EngineConfig, TalkerConfig
from scheduling import AdmissionConfig, ChunkingConfig, SchedulingConfig

CORPUS = Path(__file__).with_name("corpus.txt")
BATCHES = (1, 8, 32, 64)
DRAIN_S = 20.0  # most seconds an engine run waits for its last requests
SECTIONS = {
    "backend": BackendConfig,
    "codec_lm": CodecLMConfig,
    "talker": TalkerConfig,
    "engine": EngineConfig,
    "scheduling": SchedulingConfig,
    "chunking": ChunkingConfig,
    "admission": AdmissionConfig,
}


def load_sections(path: str, overrides: list[str]) -> dict[str, Any]:
    """The config's sections this check needs, as the pipeline's dataclasses."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    for item in overrides:
        key, _, raw = item.partition("=")
        section, _, field = key.partition(".")
        data.setdefault(section, {})[field] = yaml.safe_load(raw)
    out = {}
    for name, cls in SECTIONS.items():
        body = dict(data.get(name) or {})
        known = {f.name for f in dataclasses.fields(cls)}
        body = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items() if k in known}
        out[name] = cls(**body)
    return out


def corpus() -> list[str]:
    lines = CORPUS.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f}"


def _sync(backend: Any) -> None:
    device = backend.loaded.device
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def talker_steps(backend: Any, texts: list[str], steps: int) -> dict[int, float]:
    """Median decode-step time per batch size (and prints the prompt step too)."""
    print("\n== talker: one step = one frame for every segment in the batch ==")
    print(f"{'batch':>6} {'prompt step ms':>15} {'step ms':>9} {'frames/s':>9} {'x real time':>11}")
    results = {}
    long_texts = [t for t in texts if len(t) > 60] or texts
    frame_s = backend.samples_per_frame / backend.sample_rate_hz
    for batch in BATCHES:
        segments = [
            backend.open_segment(
                TalkRequest(long_texts[i % len(long_texts)], backend.default_voice(), 1.0, i, 0, 0)
            )
            for i in range(batch)
        ]
        try:
            start = time.perf_counter()
            backend.step(segments)
            _sync(backend)
            prompt_s = time.perf_counter() - start
            backend.step(segments)  # warm-up
            times = []
            for _ in range(steps):
                live = [s for s in segments if not s.done]
                if len(live) < batch:
                    break
                start = time.perf_counter()
                backend.step(live)
                _sync(backend)
                times.append(time.perf_counter() - start)
        finally:
            for segment in segments:
                backend.close_segment(segment)
        step_s = statistics.median(times)
        results[batch] = step_s
        rate = batch / step_s
        print(f"{batch:6d} {_ms(prompt_s):>15} {_ms(step_s):>9} {rate:9.1f} {rate * frame_s:11.1f}")
    base = results[BATCHES[0]]
    for batch in BATCHES[1:]:
        print(f"step at batch {batch} / batch 1: {results[batch] / base:.2f}x")
    return results


def vocoder_turns(backend: Any, chunking: ChunkingConfig, turns: int) -> dict[int, float]:
    print("\n== vocoder: one batched Mimi call of K chunks ==")
    left = chunking.left_context_frames
    frames = chunking.chunk_frames + left
    rng = np.random.default_rng(0)
    print(
        f"{'K':>4} {'turn ms':>9} {'audio s/s':>10}  ({chunking.chunk_frames} + {left} frames each)"
    )
    results = {}
    for k in BATCHES:
        items = [
            VocodeItem(
                backend.default_voice(),
                rng.integers(
                    0, 2048 if backend.num_codebooks == 32 else 64, (frames, backend.num_codebooks)
                ),
                left,
                chunking.chunk_frames,
            )
            for _ in range(k)
        ]
        backend.vocode(items)  # warm-up
        times = []
        for _ in range(turns):
            start = time.perf_counter()
            backend.vocode(items)
            _sync(backend)
            times.append(time.perf_counter() - start)
        turn_s = statistics.median(times)
        results[k] = turn_s
        audio_s = k * chunking.chunk_frames * backend.samples_per_frame / backend.sample_rate_hz
        print(f"{k:4d} {_ms(turn_s):>9} {audio_s / turn_s:10.1f}")
    return results


async def _closed_loop(engine: Any, streams: int, duration_s: float, texts: list[str]) -> dict:
    rng = random.Random(streams)
    records: list[tuple[float | None, Player]] = []
    stop_at = time.monotonic() + duration_s

    async def client() -> None:
        while time.monotonic() < stop_at:
            player = Player()
            sent = time.monotonic()
            first: float | None = None
            stream = engine.submit(rng.choice(texts), voice=engine.backend.default_voice())
            rate = engine.backend.sample_rate_hz
            try:
                async for pcm in stream.chunks():
                    now = time.monotonic()
                    first = now if first is None else first
                    player.feed(now, len(pcm) / rate)
            finally:
                records.append((None if first is None else first - sent, player))

    tasks = [asyncio.create_task(client()) for _ in range(streams)]
    await asyncio.sleep(duration_s)
    # let the last requests finish (their players count), bounded
    await asyncio.wait(tasks, timeout=min(duration_s, DRAIN_S))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    finished = [(ttfa, p) for ttfa, p in records if ttfa is not None]
    free = [all(s < STALL_TOLERANCE_S for s in p.stalls_s) for _, p in finished]
    ttfas = [ttfa for ttfa, _ in finished]
    return {
        "streams": len(finished),
        "stall_free": sum(free) / len(free) if free else 0.0,
        "ttfa_p50_s": percentile(ttfas, 50),
        "ttfa_p99_s": percentile(ttfas, 99),
    }


async def engine_runs(backend: Any, sections: dict[str, Any], duration_s: float) -> int | None:
    from pipeline.engine import Engine

    print("\n== engine: N concurrent streams, closed loop, 1x client-side player ==")
    print(f"{'N':>4} {'requests':>9} {'stall-free':>11} {'TTFA p50 ms':>12} {'TTFA p99 ms':>12}")
    texts = corpus()
    best = None
    for streams in BATCHES:
        engine = Engine(
            backend,
            scheduling=sections["scheduling"],
            chunking=sections["chunking"],
            admission=AdmissionConfig(enabled=False),
            engine=sections["engine"],
            talker=sections["talker"],
        )
        await engine.start()
        try:
            row = await _closed_loop(engine, streams, duration_s, texts)
        finally:
            await engine.stop()
        p50, p99 = row["ttfa_p50_s"], row["ttfa_p99_s"]
        print(
            f"{streams:4d} {row['streams']:9d} {row['stall_free']:10.0%} "
            f"{_ms(p50 or 0):>12} {_ms(p99 or 0):>12}"
        )
        if row["stall_free"] >= 0.99 and p99 is not None and p99 <= DEFAULT_SLO_S:
            best = streams
    print(f"largest N held stall-free (>= 99% streams, TTFA p99 <= 1 s): {best}")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/codec-lm-1b-random.yaml")
    parser.add_argument("--set", action="append", default=[], help="section.field=value")
    parser.add_argument("--steps", type=int, default=20, help="timed talker steps per batch")
    parser.add_argument("--turns", type=int, default=5, help="timed vocoder turns per K")
    parser.add_argument("--duration-s", type=float, default=25.0, help="engine run per N")
    parser.add_argument("--skip-engine", action="store_true", help="backend timings only")
    args = parser.parse_args()

    import torch

    from pipeline.backends.codec_lm import CodecLMBackend

    sections = load_sections(args.config, args.set)
    started = time.perf_counter()
    backend = CodecLMBackend(sections["codec_lm"])
    print(
        f"model {backend.loaded.source} on {backend.loaded.device} "
        f"({str(backend.loaded.dtype).removeprefix('torch.')}), torch {torch.__version__}, "
        f"loaded in {time.perf_counter() - started:.1f} s"
    )
    if backend.loaded.device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(backend.loaded.device)}")
    texts = corpus()
    talker_steps(backend, texts, args.steps)
    vocoder_turns(backend, sections["chunking"], args.turns)
    if not args.skip_engine:
        asyncio.run(engine_runs(backend, sections, args.duration_s))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
