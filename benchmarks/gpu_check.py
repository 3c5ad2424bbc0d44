"""GPU check of the codec-LM backend, as one prepared command (about 5-10 minutes on an H200):

    python -m benchmarks.gpu_check --out benchmarks/results/

Loads configs/codec-lm-1b-random.yaml's model (CSM-1B sizes, random weights, bfloat16) on
the GPU with sampling on (temperature 0.9, top-k 50; `--greedy` for argmax), captures every
CUDA graph, then prints, each beside its target:

1. start-up: model load and graph capture time, graphs captured, shapes that failed;
2. talker step time at batch 1, 64, 256 (steady state, steps overlapped as when serving),
   and the time of a step at batch 64 that also prefills an arriving 320-token prompt;
3. frame-for-frame checks at every row bucket: CUDA graph vs the same step run eagerly,
   and the bucket's last row batched vs the same stream alone;
4. Mimi: a turn of K chunks per K, and bfloat16 against float32 (SNR, dB);
5. the Engine: N streams, each client looping over requests, the clients arriving spread
   over the first `--ramp-s`, each played by a 1x player; stall-free share, TTFA p50/p99
   per N; the largest N held stall-free (>= 99% of streams, TTFA p99 <= 500 ms); TTFA p50
   of one stream; graphs met while streams played that start-up had not captured.

Every part is bounded (steps, seconds); parts left when `--budget-s` is spent are skipped
and said so. The printed text and a JSON of the figures go to `--out` (gpu-check-<time>.txt,
.json). `--device cpu --tiny` runs every part on the tiny model, small and short: a smoke
test (tests/test_gpu_check.py) so the GPU session does not meet a typo.

Imports only pipeline/, scheduling/, benchmarks/player.py and virtual_time.py, torch,
transformers and yaml.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import itertools
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.gpu_step import compiled_step_checks
from benchmarks.player import STALL_TOLERANCE_S, Player, percentile
from benchmarks.virtual_time import SpentTime, VirtualTimeLoop, virtual_stages
from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends.gpu_costs import GpuCostTable, load_cost_table, table_from_dict
from pipeline.backends.gpu_model import GpuModelBackend
from pipeline.config import CodecLMConfig, EngineConfig, GpuModelConfig, TalkerConfig, TextConfig
from scheduling import AdmissionConfig, ChunkingConfig, SchedulingConfig

CORPUS = Path(__file__).with_name("corpus.txt")
ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {
    "codec_lm": CodecLMConfig,
    "talker": TalkerConfig,
    "text": TextConfig,
    "engine": EngineConfig,
    "scheduling": SchedulingConfig,
    "chunking": ChunkingConfig,
}
TTFA_P99_TARGET_S = 0.5
STALL_FREE_TARGET = 0.99
FULL = {
    "batches": (1, 64, 256),
    "streams": (1, 64, 128, 256),
    "steps": 30,
    "check_steps": 6,
    "vocoder_k": (1, 8, 16, 64),
    "ramps": ((2, 4),),  # the ramp before [2, 3, 5], in the same run
    "ramp_streams": (64, 256),
}
TINY = {
    "batches": (1, 4, 8),
    "streams": (1, 4),
    "steps": 3,
    "check_steps": 3,
    "vocoder_k": (1, 4),
    "ramps": ((2, 4),),
    "ramp_streams": (4,),
}
LONG_PROMPT_CHARS = 300


def load_sections(path: Path, overrides: list[str]) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    for item in overrides:
        key, _, raw = item.partition("=")
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = yaml.safe_load(raw)
    out = {}
    for name, cls in SECTIONS.items():
        known = {f.name for f in dataclasses.fields(cls)}
        body = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in (data.get(name) or {}).items()
            if k in known
        }
        out[name] = cls(**body)
    return out


def corpus() -> list[str]:
    lines = CORPUS.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


class Report:
    """Prints, keeps the text, and collects the figures for the JSON."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.figures: dict[str, Any] = {}

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def target(self, label: str, value: Any, goal: str, met: bool | None) -> None:
        mark = "n/a" if met is None else ("MET" if met else "NOT MET")
        self(f"  {label}: {value}   target {goal}: {mark}")


def _sync(backend: Any) -> None:
    if backend.loaded.device.type == "cuda":
        import torch

        torch.cuda.synchronize(backend.loaded.device)


def _request(backend: Any, text: str, tag: int) -> TalkRequest:
    return TalkRequest(text, backend.default_voice(), 1.0, tag, 0, 0)


def open_talking(backend: Any, texts: list[str], count: int, first_tag: int = 0) -> list:
    """`count` segments opened and stepped until each has its first frame launched."""
    segments = [
        backend.open_segment(_request(backend, texts[i % len(texts)], first_tag + i))
        for i in range(count)
    ]
    while waiting := [s for s in segments if s.launched == 0]:
        backend.step(waiting)  # the others sit out: none runs out of frames meanwhile
    return segments


def close_segments(backend: Any, segments: list) -> None:
    for segment in segments:
        backend.close_segment(segment)
    backend.close()  # collects the step still in flight


def talker_steps(report: Report, backend: Any, texts: list[str], batches, steps: int) -> None:
    report("\n== talker step: one frame for every segment (steps overlapped as serving) ==")
    report(f"{'batch':>6} {'step ms':>9} {'frames/s':>10} {'x real time':>12}")
    frame_s = backend.samples_per_frame / backend.sample_rate_hz
    long_texts = [t for t in texts if len(t) > 60] or texts
    results = {}
    for batch in batches:
        if batch > backend.stepper.cache.capacity and not backend.stepper.cache.grows:
            report(f"{batch:6d} skipped: more than codec_lm.max_rows slots")
            continue
        segments = open_talking(backend, long_texts, batch)
        try:
            usable = min(s.max_frames - s.launched for s in segments) - 1
            count = max(1, min(steps, usable))
            _sync(backend)
            start = time.perf_counter()
            for _ in range(count):
                backend.step(segments)
            _sync(backend)
            step_s = (time.perf_counter() - start) / count
        finally:
            close_segments(backend, segments)
        results[batch] = step_s
        rate = batch / step_s
        report(f"{batch:6d} {step_s * 1e3:9.1f} {rate:10.1f} {rate * frame_s:12.1f}")
    report.figures["step_ms"] = {b: round(s * 1e3, 2) for b, s in results.items()}
    # a step that also prefills an arriving long prompt
    batch = 64 if 64 in results else max(results)
    segments = open_talking(backend, long_texts, batch)
    newcomer = backend.open_segment(_request(backend, ("word " * 80)[:LONG_PROMPT_CHARS], 9999))
    try:
        backend.step(segments)
        _sync(backend)
        start = time.perf_counter()
        backend.step([*segments, newcomer])
        _sync(backend)
        arrival_s = time.perf_counter() - start
    finally:
        close_segments(backend, [*segments, newcomer])
    report.figures["step_with_arrival_ms"] = round(arrival_s * 1e3, 2)
    report(
        f"step at batch {batch} prefilling a {len(newcomer.prompt)}-token prompt: "
        f"{arrival_s * 1e3:.1f} ms (its first {backend.config.prefill_chunk_tokens} tokens)"
    )
    if 64 in results:
        report.target(
            "step at batch 64", f"{results[64] * 1e3:.1f} ms", "<= 20 ms", results[64] <= 0.020
        )
    report.target(
        "step with an arriving prompt",
        f"{arrival_s * 1e3:.1f} ms",
        "< one 80 ms frame",
        arrival_s < frame_s,
    )


def profile_steps(report: Report, backend: Any, texts: list[str], batch: int, steps: int) -> None:
    """Where a step's time goes: kernels per step and their summed GPU time, replayed from
    the graphs and run eagerly, against the step's wall time; the costliest kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    report(f"\n== profile: talker steps at batch {batch}, graph replay and eager ==")
    report(f"{'mode':>7} {'wall ms':>8} {'kernels':>8} {'kernel ms':>10}  (per step)")
    cuda = backend.loaded.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    long_texts = [t for t in texts if len(t) > 60] or texts
    graphs = backend.stepper.graphs
    figures: dict[str, Any] = {}
    for mode, replay in (("graph", True), ("eager", False)):
        segments = open_talking(backend, long_texts, batch)
        graphs.replay = replay
        try:
            count = max(1, min(steps, min(s.max_frames - s.launched for s in segments) - 2))
            backend.step(segments)  # warm
            _sync(backend)
            with profile(activities=activities) as prof:
                started = time.perf_counter()
                for _ in range(count):
                    backend.step(segments)
                _sync(backend)
                wall_ms = (time.perf_counter() - started) * 1e3 / count
        finally:
            graphs.replay = True
            close_segments(backend, segments)
        kernels = [
            e
            for e in prof.events()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        ]
        busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / count
        per_name: dict[str, float] = {}
        for e in kernels:
            per_name[e.name] = per_name.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / count
        top = sorted(per_name.items(), key=lambda kv: -kv[1])[:6]
        figures[mode] = {
            "wall_ms": round(wall_ms, 2),
            "kernels": round(len(kernels) / count, 1),
            "kernel_ms": round(busy_ms, 2),
            "top": [(name[:90], round(ms, 3)) for name, ms in top],
        }
        report(f"{mode:>7} {wall_ms:8.1f} {len(kernels) / count:8.0f} {busy_ms:10.2f}")
        for name, ms in top:
            report(f"          {ms:7.3f} ms  {name[:90]}")
    report.figures["profile"] = figures


def _first_frames(backend: Any, texts: list[str], tags: list[int], count: int) -> list[list]:
    """Each segment's first `count` frames (opened together, stepped together)."""
    segments = [
        backend.open_segment(_request(backend, texts[tag % len(texts)], tag)) for tag in tags
    ]
    got: list[list] = [[] for _ in segments]
    try:
        for _ in range(100 * len(segments) + 10 * count):  # bounded: prefill, then frames
            live = [i for i, s in enumerate(segments) if not s.done]
            if not live or all(len(g) >= count for g in got):
                break
            for i, step in zip(live, backend.step([segments[i] for i in live]), strict=True):
                got[i].extend(step.frames.tolist())
    finally:
        close_segments(backend, segments)
    return [g[:count] for g in got]


def bucket_checks(report: Report, backend: Any, texts: list[str], steps: int) -> None:
    report("\n== frame for frame at every row bucket: graph vs eager, batched vs alone ==")
    report(
        f"{'rows':>5} {'graph = eager':>14} {'batched = alone':>16} {'greedy: b = a':>14}"
        f"  (first {steps} frames)"
    )
    stepper = backend.stepper
    graphs = stepper.graphs
    checked = {}
    for rows in stepper.row_buckets:
        if rows > stepper.cache.capacity:
            break
        tags = list(range(rows))  # the last one sits in the bucket's last row
        temperature = stepper.temperature
        try:
            graphs.replay = False
            eager = _first_frames(backend, texts, tags, steps)
            # greedy (eager: the graphs hold the sampling they were captured with): is a
            # batched row's difference the matrix kernels' (greedy too) or the draw's?
            stepper.temperature = 0.0
            greedy = _first_frames(backend, texts, tags, steps)
            (greedy_alone,) = _first_frames(backend, texts, tags[-1:], steps)
        finally:
            graphs.replay, stepper.temperature = True, temperature
        graphed = _first_frames(backend, texts, tags, steps)
        (alone,) = _first_frames(backend, texts, tags[-1:], steps)
        same_graph = graphed == eager
        same_alone = graphed[-1] == alone and len(alone) == steps
        same_greedy = greedy[-1] == greedy_alone and len(greedy_alone) == steps
        checked[rows] = {
            "graph_equals_eager": same_graph,
            "batched_equals_alone": same_alone,
            "greedy_batched_equals_alone": same_greedy,
        }
        report(f"{rows:5d} {same_graph!s:>14} {same_alone!s:>16} {same_greedy!s:>14}")
    report.figures["buckets"] = checked


def vocoder_checks(
    report: Report, backend: Any, chunking: ChunkingConfig, turns: int, ks: tuple[int, ...]
) -> None:
    import torch

    from pipeline.backends.codec_lm.loading import cast_codec

    report("\n== Mimi: one batched call of K chunks; bfloat16 vs float32 ==")
    frames = chunking.chunk_frames + chunking.left_context_frames
    rng = np.random.default_rng(0)
    codes = int(backend.loaded.model.codec_model.config.codebook_size)
    items_all = [
        VocodeItem(
            backend.default_voice(),
            rng.integers(0, codes, (frames, backend.num_codebooks)),
            chunking.left_context_frames,
            chunking.chunk_frames,
        )
        for _ in range(64)
    ]
    report(
        f"{'K':>4} {'turn ms':>9}   ({chunking.chunk_frames} + "
        f"{chunking.left_context_frames} frames each, Mimi in "
        f"{str(next(backend.vocoder.codec.parameters()).dtype).removeprefix('torch.')})"
    )
    turns_ms = {}
    for k in ks:
        items = items_all[:k]
        backend.vocode(items)
        start = time.perf_counter()
        for _ in range(turns):
            backend.vocode(items)
        turns_ms[k] = (time.perf_counter() - start) / turns * 1e3
        report(f"{k:4d} {turns_ms[k]:9.1f}")
    report.figures["vocoder_turn_ms"] = turns_ms
    codec = backend.vocoder.codec
    batch = torch.from_numpy(np.stack([i.frames.T for i in items_all[:16]])).to(
        backend.vocoder.device
    )
    with torch.inference_mode():
        ref = cast_codec(copy.deepcopy(codec), torch.float32).decode(batch)[0].float()
        test = cast_codec(copy.deepcopy(codec), torch.bfloat16).decode(batch)[0].float()
    noise = (ref - test).pow(2).sum().item()
    snr_db = 10 * np.log10(ref.pow(2).sum().item() / max(noise, 1e-30))
    report.figures["mimi_bf16_snr_db"] = round(float(snr_db), 2)
    report(
        f"Mimi bfloat16 vs float32 on 16 chunks of random codes: SNR {snr_db:.1f} dB "
        "(keep float32 unless this is inaudible)"
    )


class _Timed:
    """Wall time and batch size of each call of a backend method (the executor's calls)."""

    def __init__(self, backend: Any, name: str) -> None:
        self.backend, self.name = backend, name
        self.method = getattr(backend, name)
        self.calls: list[tuple[float, int, int]] = []  # seconds, items, prefill rows

    def __enter__(self) -> _Timed:
        def timed(items, *args, **kwargs):
            started = time.perf_counter()
            try:
                return self.method(items, *args, **kwargs)
            finally:
                flight = getattr(self.backend, "_in_flight", None) if self.name == "step" else None
                prefill = flight.prefill if flight else 0
                self.calls.append((time.perf_counter() - started, len(items), prefill))

        setattr(self.backend, self.name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        delattr(self.backend, self.name)  # the class's method again

    def summary(self) -> dict[str, Any]:
        if not self.calls:
            return {"calls": 0}
        ms = [c[0] * 1e3 for c in self.calls]
        return {
            "calls": len(ms),
            "ms_p50": round(percentile(ms, 50), 2),
            "ms_p90": round(percentile(ms, 90), 2),
            "ms_p99": round(percentile(ms, 99), 2),
            "items_mean": round(sum(c[1] for c in self.calls) / len(ms), 1),
            **(
                {"with_prefill": round(sum(1 for c in self.calls if c[2]) / len(ms), 3)}
                if self.name == "step"
                else {}
            ),
        }


def _stall_places(players: list[Player]) -> dict[str, Any]:
    """Where in the audio the stalls fell: the first 0.5 s (the ramp's chunks) or later."""
    pairs = [(a, s) for p in players for a, s in zip(p.stalls_at_s, p.stalls_s, strict=True)]
    at = [a for a, s in pairs if s >= STALL_TOLERANCE_S]
    lengths = [s * 1e3 for p in players for s in p.stalls_s if s >= STALL_TOLERANCE_S]
    return {
        "stalls": len(at),
        "in_first_0_5_s": sum(1 for a in at if a <= 0.5),
        "audio_at_p50_s": round(percentile(at, 50), 2) if at else None,
        "stall_ms_p50": round(percentile(lengths, 50), 1) if lengths else None,
        "stall_ms_max": round(max(lengths), 1) if lengths else None,
    }


async def engine_run(
    engine: Any, streams: int, duration_s: float, ramp_s: float, texts, admitted: bool = False
):
    """N clients looping over `texts`; `admitted`: each request through admission as the
    API's (reserve, wait in its queue, submit), a refused one retried after its
    Retry-After (at most 1 s), TTFA counted from the first try."""
    from pipeline.errors import Rejected

    rng = random.Random(streams)
    records: list[tuple[float | None, Player]] = []
    rejected = [0]
    clock = asyncio.get_running_loop().time  # time.monotonic, or a virtual loop's time
    stop_at = clock() + duration_s

    async def admit() -> Any:
        text, voice = rng.choice(texts), engine.backend.default_voice()
        while admitted:
            try:
                reservation = engine.reserve()
                try:
                    await reservation.wait_start()
                except BaseException:
                    reservation.release()
                    raise
                return engine.submit(text, voice=voice, reservation=reservation)
            except Rejected as refused:
                rejected[0] += 1
                await asyncio.sleep(min(refused.retry_after_s, 1.0))
        return engine.submit(text, voice=voice)

    async def client() -> None:
        await asyncio.sleep(rng.uniform(0, ramp_s))  # arrivals spread over the run's start
        while clock() < stop_at:
            player, sent, first = Player(), clock(), None
            stream = await admit()
            rate = engine.backend.sample_rate_hz
            try:
                async for pcm in stream.chunks():
                    now = clock()
                    first = now if first is None else first
                    player.feed(now, len(pcm) / rate)
            finally:
                records.append((None if first is None else first - sent, player))

    tasks = [asyncio.create_task(client()) for _ in range(streams)]
    await asyncio.sleep(duration_s)
    await asyncio.wait(tasks, timeout=max(5.0, duration_s))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    done = [(t, p) for t, p in records if t is not None]
    free = [all(s < STALL_TOLERANCE_S for s in p.stalls_s) for _, p in done]
    ttfas = [t for t, _ in done]
    margins = [p.margin_s for _, p in done if p.margin_s is not None]
    return {
        # the least audio ahead as a chunk arrived, 1st percentile over streams (negative:
        # a stall): how close to stalling the stall-free ones came
        "margin_p1_s": round(percentile(margins, 1), 3) if margins else None,
        "stall_places": _stall_places([p for _, p in done]),
        "requests": len(done),
        **({"rejected": rejected[0]} if admitted else {}),
        "stall_free": sum(free) / len(free) if free else 0.0,
        "ttfa_p50_s": percentile(ttfas, 50) if ttfas else None,
        "ttfa_p99_s": percentile(ttfas, 99) if ttfas else None,
    }


# == the cost table: this run's measured costs as the GPU model reads them
# (pipeline/backends/gpu_costs.py), recorded in the JSON as `cost_table` ==


def prefill_costs(report: Report, backend: Any, texts: list[str], batch: int) -> None:
    """What prefill adds to a step, by prompt tokens carried: a step of `batch` talking
    segments carrying the first chunk of 1 and of `prefill_rows` arriving 300-character
    prompts, against the same step without, each timed alone and synchronised (the cost
    table's `prefill_ms`)."""
    report("\n== prefill: a step carrying arriving prompts, against the same step without ==")
    long_texts = [t for t in texts if len(t) > 60] or texts
    lm = backend.config
    out: dict[int, float] = {}
    for arriving in sorted({1, lm.prefill_rows}):
        segments = open_talking(backend, long_texts, batch)
        newcomers = [
            backend.open_segment(_request(backend, ("word " * 80)[:LONG_PROMPT_CHARS], 9000 + i))
            for i in range(arriving)
        ]
        try:
            backend.step(segments)
            timed = []
            for group in (segments, [*segments, *newcomers]):
                _sync(backend)
                start = time.perf_counter()
                backend.step(group)
                _sync(backend)
                timed.append((time.perf_counter() - start) * 1e3)
        finally:
            close_segments(backend, [*segments, *newcomers])
        tokens = sum(min(lm.prefill_chunk_tokens, len(n.prompt)) for n in newcomers)
        out[tokens] = round(max(0.0, timed[1] - timed[0]), 3)
        report(
            f"{arriving} arriving ({tokens} tokens) at batch {batch}: {timed[1]:.1f} ms "
            f"against {timed[0]:.1f} ms without: +{out[tokens]:.1f} ms"
        )
    report.figures["prefill_ms_by_tokens"] = out


def cost_table_from_figures(
    figures: dict[str, Any], sections: dict[str, Any], unmeasured: GpuCostTable
) -> dict[str, Any]:
    """The table of what this run measured: the talker step per row bucket (its batches),
    the prefill a step with an arriving prompt paid on top of the step alone (its first
    `prefill_chunk_tokens` tokens), Mimi's turn per K (chunks of chunk + left-context
    frames); the host constants, not measured here, from `unmeasured`."""
    lm, chunking = sections["codec_lm"], sections["chunking"]
    steps = {int(b): float(ms) for b, ms in figures.get("step_ms", {}).items()}
    if not steps:
        raise ValueError("no talker step measured: no cost table")
    rows: dict[int, float] = {}
    for batch, ms in sorted(steps.items()):  # the larger batch of a shared bucket
        rows[max(lm.row_multiple, -(-batch // lm.row_multiple) * lm.row_multiple)] = ms
    # talker_steps' prompts are the corpus's long sentences: keys in the 256 bucket
    decode = [{"rows": r, "keys": 2 * lm.key_bucket_tokens, "ms": ms} for r, ms in rows.items()]
    arrival = figures.get("step_with_arrival_ms")
    batch = 64 if 64 in steps else max(steps)
    prefill = {int(t): float(ms) for t, ms in figures.get("prefill_ms_by_tokens", {}).items()}
    if not prefill and arrival is not None:  # the step with one arriving prompt, less one alone
        prefill = {lm.prefill_chunk_tokens: max(0.0, arrival - steps[batch])}
    frames = chunking.chunk_frames + chunking.left_context_frames
    turns = figures.get("vocoder_turn_ms", {})
    table = {
        "name": f"gpu-check {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}",
        "source": (
            "measured by benchmarks/gpu_check.py: talker steps overlapped as served, the "
            f"prefill of arriving prompts' first chunks at batch {batch} (by tokens), Mimi "
            f"turns of {frames}-frame chunks; host constants and the prefill's per-token "
            f"rule past the measured not measured, from {unmeasured.name}"
        ),
        "estimated": [] if prefill else ["prefill_ms"],
        "talker": {
            "row_multiple": lm.row_multiple,
            "max_rows": lm.max_rows,
            "key_bucket_tokens": lm.key_bucket_tokens,
            "max_keys": lm.max_prompt_tokens + lm.max_frames_per_segment,
            "decode_ms": [{**c, "ms": round(c["ms"], 3)} for c in decode],
            "prefill_ms": [
                {"tokens": t, "ms": round(ms, 3)}
                for t, ms in sorted(
                    (prefill or {64: unmeasured.prefill(lm.prefill_chunk_tokens)}).items()
                )
            ],
            "prefill_ms_per_token": unmeasured.prefill_ms_per_token,
            "prefill_makes_frames": False,  # since 42ab416: a prefill is the backbone only
            "host_ms_per_step": unmeasured.host_ms_per_step,
            "host_ms_per_segment": unmeasured.host_ms_per_segment,
        },
        "mimi": {
            "max_batch": max(1, lm.vocoder_max_batch),
            "max_frames": max(4, lm.vocoder_max_frames),
            "turn_ms": [
                {"chunks": int(k), "frames": frames, "ms": round(float(ms), 3)}
                for k, ms in sorted(turns.items(), key=lambda kv: int(kv[0]))
            ],
        },
    }
    table_from_dict(table)  # the schema's own checks
    return table


def cost_table_section(report: Report, sections: dict[str, Any]) -> GpuCostTable:
    unmeasured = load_cost_table(GpuModelConfig().cost_table)
    table = cost_table_from_figures(report.figures, sections, unmeasured)
    report.figures["cost_table"] = table
    built = table_from_dict(table)
    report("\n== cost table (the GPU model's costs, measured here; JSON: cost_table) ==")
    report(
        "decode ms by rows: "
        + ", ".join(f"{c['rows']}: {c['ms']:.1f}" for c in table["talker"]["decode_ms"])
    )
    report(
        "prefill on top of a step, by tokens carried: "
        + ", ".join(f"{c['tokens']}: {c['ms']:.1f} ms" for c in table["talker"]["prefill_ms"])
    )
    report(
        "Mimi turn ms by K: "
        + ", ".join(f"{c['chunks']}: {c['ms']:.1f}" for c in table["mimi"]["turn_ms"])
    )
    report(
        f"not measured here (from {unmeasured.name}): host {built.host_ms_per_step} ms a step "
        f"+ {built.host_ms_per_segment} ms a segment, prefill +{built.prefill_ms_per_token} "
        "ms a token past the measured"
    )
    return built


# == the model's prediction (pipeline/backends/gpu_model.py): the same Engine and load on
# the gpu_model backend replaying a cost table, on a virtual clock or in real time ==

MODEL_RAMP_S = 5.0


def model_config(sections: dict[str, Any], chars_per_token: float) -> GpuModelConfig:
    """The gpu_model section matching a codec-LM config's shapes."""
    lm = sections["codec_lm"]
    return GpuModelConfig(
        prompt_chars_per_token=chars_per_token,
        frames_per_char=lm.frames_per_char,
        min_frames_per_segment=lm.min_frames_per_segment,
        max_frames_per_segment=lm.max_frames_per_segment,
        max_prompt_tokens=lm.max_prompt_tokens,
        prefill_chunk_tokens=lm.prefill_chunk_tokens,
        prefill_rows=lm.prefill_rows,
        overlap_steps=lm.overlap_steps,
    )


def _calls(calls: list[tuple], prefill: bool) -> dict[str, Any]:
    if not calls:
        return {"calls": 0}
    ms = [c[0] * 1e3 for c in calls]
    out = {
        "calls": len(ms),
        "ms_p50": round(percentile(ms, 50), 2),
        "ms_p90": round(percentile(ms, 90), 2),
        "items_mean": round(sum(c[1] for c in calls) / len(ms), 1),
    }
    if prefill:
        out["with_prefill"] = round(sum(1 for c in calls if c[2]) / len(ms), 3)
        # gpu_check before 2026-12-05 counted as `with_prefill` the steps in which a
        # prompt ended (048f89d's _Timed), this share
        out["with_prompt_end"] = round(sum(1 for c in calls if c[3]) / len(ms), 3)
        # the engine's own time between a step's return and the next step's call
        gaps = [b[4] - (a[4] + a[0]) for a, b in itertools.pairwise(calls)]
        out["gap_ms_p50"] = round(1e3 * percentile(gaps, 50), 2) if gaps else None
    return out


def admission_config(path: Path) -> AdmissionConfig:
    """The config file's admission section (as served)."""
    body = (yaml.safe_load(path.read_text()) or {}).get("admission") or {}
    return AdmissionConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in body.items()})


async def _point(
    backend, sections, streams: int, seconds: float, clock, admission: AdmissionConfig | None
) -> dict[str, Any]:
    from pipeline.engine import Engine

    engine = Engine(
        backend,
        scheduling=sections["scheduling"],
        chunking=sections["chunking"],
        admission=admission or AdmissionConfig(enabled=False),
        engine=sections["engine"],
        talker=dataclasses.replace(sections["talker"], batch=max(streams, 1)),
        text=sections["text"],
        clock=clock,
    )
    await engine.start()
    try:
        row = await engine_run(
            engine,
            streams,
            seconds,
            min(MODEL_RAMP_S, seconds / 3),
            corpus(),
            admission is not None,
        )
    finally:
        await engine.stop()
    row["talker_steps"] = _calls(backend.step_calls, prefill=True)
    row["vocoder_calls"] = _calls(backend.vocode_calls, prefill=False)
    return row


def run_point(
    mode: str,
    table: GpuCostTable,
    sections: dict[str, Any],
    streams: int,
    seconds: float,
    chars_per_token: float = 1.0,
    admission: AdmissionConfig | None = None,
) -> dict[str, Any]:
    """One engine run at N streams, `mode` 'virtual_time' or 'real_time'; with `admission`
    the clients go through it as the API's do (else it is off, as in gpu_check)."""
    config = model_config(sections, chars_per_token)
    started = time.perf_counter()
    if mode == "real_time":
        backend = GpuModelBackend(config, table)
        row = asyncio.run(_point(backend, sections, streams, seconds, time.monotonic, admission))
    elif mode == "virtual_time":
        loop, spent = VirtualTimeLoop(), SpentTime()
        backend = GpuModelBackend(config, table, sleep=spent, clock=loop.time)
        try:
            with virtual_stages(spent):
                row = loop.run_until_complete(
                    _point(backend, sections, streams, seconds, loop.time, admission)
                )
        finally:
            loop.close()
    else:
        raise ValueError(f"mode must be real_time or virtual_time, got {mode!r}")
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def predict_beside(
    report: Report, table: GpuCostTable, runs: dict[str, dict[str, Any]], seconds: float
) -> None:
    """The model's prediction of every engine figure measured (`runs`: label -> the
    sections it ran with): this run's cost table, the same engine settings and load,
    byte-tokenizer prompts as the random model's, on a virtual clock; printed beside the
    measurement, kept in each row with its error."""
    report(
        "\n== the GPU model's prediction beside each engine figure (this run's cost table, "
        "virtual clock, byte-tokenizer prompts) =="
    )
    report(f"{'':>22} {'N':>4} {'stall-free':>10} {'TTFA p50':>9} {'TTFA p99':>9} {'step p50':>9}")
    for label, sections in runs.items():
        for streams, row in report.figures.get(label, {}).items():
            model = run_point("virtual_time", table, sections, streams, seconds)
            steps = model["talker_steps"]
            row["predicted"] = {
                k: model[k] for k in ("stall_free", "ttfa_p50_s", "ttfa_p99_s", "stall_places")
            } | {"step_ms_p50": steps.get("ms_p50"), "with_prefill": steps.get("with_prefill")}
            error: dict[str, float | None] = {
                "stall_free_points": round(100 * (model["stall_free"] - row["stall_free"]), 1)
            }
            for key, measured, predicted in (
                ("ttfa_p50", row["ttfa_p50_s"], model["ttfa_p50_s"]),
                ("ttfa_p99", row["ttfa_p99_s"], model["ttfa_p99_s"]),
                ("step_p50", row["talker_steps"].get("ms_p50"), steps.get("ms_p50")),
            ):
                ok = measured and predicted is not None
                error[f"{key}_rel"] = round(predicted / measured - 1, 3) if ok else None
            row["prediction_error"] = error
            for name, got, step in (
                (f"{label} measured", row, row["talker_steps"].get("ms_p50")),
                ("model", model, steps.get("ms_p50")),
            ):
                p50, p99 = (got["ttfa_p50_s"] or 0.0) * 1e3, (got["ttfa_p99_s"] or 0.0) * 1e3
                report(
                    f"{name:>22} {streams:4d} {got['stall_free']:10.0%} {p50:9.1f} {p99:9.1f} "
                    f"{step or float('nan'):9.1f}"
                )
            report(f"{'model error':>22} {streams:4d} {error}")


async def engine_checks(
    report,
    backend,
    sections,
    streams_list,
    duration_s,
    ramp_s,
    deadline,
    label="engine",
):
    from pipeline.engine import Engine

    report(
        f"\n== Engine{'' if label == 'engine' else f' ({label})'}: N streams looping over "
        f"requests, arriving over the first {ramp_s:.0f} s, 1x players, ramp "
        f"{list(sections['chunking'].ramp)} =="
    )
    report(f"{'N':>4} {'requests':>9} {'stall-free':>11} {'TTFA p50 ms':>12} {'TTFA p99 ms':>12}")
    texts, best, rows = corpus(), None, {}
    talker = dataclasses.replace(
        sections["talker"], batch=max(max(streams_list), sections["talker"].batch)
    )
    for streams in streams_list:
        if time.monotonic() > deadline:
            report(f"{streams:4d} skipped: --budget-s spent")
            continue
        with _Timed(backend, "step") as steps, _Timed(backend, "vocode") as vocodes:
            engine = Engine(  # after the timers: its stages take the backend's methods
                backend,
                scheduling=sections["scheduling"],
                chunking=sections["chunking"],
                admission=AdmissionConfig(enabled=False),
                engine=sections["engine"],
                talker=talker,
                text=sections["text"],
            )
            await engine.start()
            try:
                row = await engine_run(engine, streams, duration_s, ramp_s, texts)
            finally:
                await engine.stop()
        row["talker_steps"], row["vocoder_calls"] = steps.summary(), vocodes.summary()
        rows[streams] = row
        p50, p99 = row["ttfa_p50_s"] or 0, row["ttfa_p99_s"] or 0
        report(
            f"{streams:4d} {row['requests']:9d} {row['stall_free']:10.0%} "
            f"{p50 * 1e3:12.1f} {p99 * 1e3:12.1f}"
        )
        report(f"     stalls: {row['stall_places']}")
        report(f"     talker steps: {row['talker_steps']}")
        report(f"     vocoder calls: {row['vocoder_calls']}")

        if row["stall_free"] >= STALL_FREE_TARGET and row["requests"] and p99 <= TTFA_P99_TARGET_S:
            best = streams
    if label != "engine":
        report.figures[label] = rows
        return
    report.figures["engine"] = rows
    report.figures["largest_n_stall_free"] = best
    report.target(
        "largest N stall-free (>= 99%, TTFA p99 <= 500 ms)",
        best,
        ">= 256",
        best is not None and best >= 256,
    )
    if 1 in rows and rows[1]["ttfa_p50_s"] is not None:
        p50 = rows[1]["ttfa_p50_s"]
        report.target("TTFA p50, one stream", f"{p50 * 1e3:.1f} ms", "<= 100 ms", p50 <= 0.100)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=None, help="default: 1b-random (--tiny)")
    parser.add_argument("--set", action="append", default=[], help="section.field=value")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="the tiny model, short and small")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--duration-s", type=float, default=None, help="engine run per N")
    parser.add_argument("--budget-s", type=float, default=540.0, help="skip parts past this")
    parser.add_argument(
        "--compiled-step",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the compiled step against the eager one (benchmarks/gpu_step.py)",
    )
    args = parser.parse_args(argv)
    tiny = args.tiny
    sizes = TINY if tiny else FULL
    config = args.config or ROOT / "configs" / (
        "codec-lm-tiny.yaml" if tiny else "codec-lm-1b-random.yaml"
    )
    sampling = [] if args.greedy else ["codec_lm.temperature=0.9", "codec_lm.top_k=50"]
    overrides = [
        "engine.calibration_calls=0",  # admission is off here: no capacity to calibrate
        f"codec_lm.device={args.device}",
        *sampling,
        "codec_lm.overlap_steps=true",
        *(["codec_lm.max_frames_per_segment=60"] if tiny else []),
        *args.set,
    ]
    sections = load_sections(config, overrides)
    duration_s = args.duration_s or (2.0 if tiny else 15.0)
    report = Report()
    started = time.monotonic()
    deadline = started + args.budget_s

    import torch

    from pipeline.backends.codec_lm import CodecLMBackend

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report(f"# python -m benchmarks.gpu_check {' '.join(argv or sys.argv[1:])}  ({stamp})")
    loaded_at = time.perf_counter()
    backend = CodecLMBackend(sections["codec_lm"])
    load_s = time.perf_counter() - loaded_at - backend.startup_s
    device = backend.loaded.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    cfg = backend.config
    report(
        f"model {backend.loaded.source} on {name} "
        f"({str(backend.loaded.dtype).removeprefix('torch.')}), torch {torch.__version__}, "
        f"sampling {'off' if args.greedy else f'T={cfg.temperature} top-k={cfg.top_k}'}"
    )
    graphs, vgraphs = backend.stepper.graphs, backend.vocoder.graphs
    report(
        f"start-up: model {load_s:.1f} s; CUDA graph capture {backend.startup_s:.1f} s "
        f"({graphs.captured} talker graphs, {vgraphs.captured} Mimi graphs; "
        f"failed: talker {len(graphs.failed)}, Mimi {len(vgraphs.failed)})"
    )
    for key, why in list(graphs.failed.items())[:3] + list(vgraphs.failed.items())[:3]:
        report(f"  no graph for {key}: {why[:200]}")
    report.figures.update(
        load_s=round(load_s, 2),
        capture_s=round(backend.startup_s, 2),
        talker_graphs=graphs.captured,
        mimi_graphs=vgraphs.captured,
        talker_graph_failures=len(graphs.failed),
        mimi_graph_failures=len(vgraphs.failed),
    )
    texts = corpus()
    model: dict[str, GpuCostTable] = {}  # this run's cost table, once measured
    parts = [
        ("talker", lambda: talker_steps(report, backend, texts, sizes["batches"], sizes["steps"])),
        ("prefill", lambda: prefill_costs(report, backend, texts, 4 if tiny else 64)),
        ("buckets", lambda: bucket_checks(report, backend, texts, sizes["check_steps"])),
        (
            "vocoder",
            lambda: vocoder_checks(
                report, backend, sections["chunking"], 2 if tiny else 10, sizes["vocoder_k"]
            ),
        ),
        (
            "profile",
            lambda: profile_steps(report, backend, texts, 4 if tiny else 64, sizes["steps"] // 3),
        ),
        (
            "engine",
            lambda: asyncio.run(
                engine_checks(
                    report,
                    backend,
                    sections,
                    sizes["streams"],
                    duration_s,
                    min(5.0, duration_s / 3),
                    deadline,
                )
            ),
        ),
    ]
    for ramp in sizes["ramps"]:  # the same Engine run with another first chunks' ramp
        other = dict(sections, chunking=dataclasses.replace(sections["chunking"], ramp=ramp))
        parts.append(
            (
                f"engine ramp {list(ramp)}",
                lambda other=other, ramp=ramp: asyncio.run(
                    engine_checks(
                        report,
                        backend,
                        other,
                        sizes["ramp_streams"],
                        duration_s,
                        min(5.0, duration_s / 3),
                        deadline,
                        label=f"engine_ramp_{'_'.join(map(str, ramp))}",
                    )
                ),
            )
        )
    runs = {"engine": sections} | {
        f"engine_ramp_{'_'.join(map(str, r))}": dict(
            sections, chunking=dataclasses.replace(sections["chunking"], ramp=r)
        )
        for r in sizes["ramps"]
    }
    parts.append(("cost table", lambda: model.update(table=cost_table_section(report, sections))))
    parts.append(
        (
            "model",
            lambda: model.get("table") and predict_beside(report, model["table"], runs, duration_s),
        )
    )
    if args.compiled_step:  # last: its compile may take minutes, and the rest comes first
        parts.append(
            (
                "compiled step",  # against the eager one, the same minutes (gpu_step.py)
                lambda: compiled_step_checks(
                    report, backend, texts, sizes["batches"], sizes["steps"], 3 if tiny else 24
                ),
            )
        )
    for part, run in parts:
        if time.monotonic() > deadline:
            report(f"\n== {part}: skipped, --budget-s spent ==")
            continue
        try:
            run()
        except Exception as error:  # one part failing still leaves the others' figures
            report(f"\n== {part} FAILED: {type(error).__name__}: {error} ==")
            report.figures.setdefault("failed", {})[part] = repr(error)
    late = sorted(map(str, graphs.late_keys | vgraphs.late_keys))
    report.figures["late_graph_keys"] = late
    report(f"\nshapes met while serving without a start-up graph: {late or 'none'}")
    report(f"total {time.monotonic() - started:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"gpu-check-{'tiny-' if tiny else ''}{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    (args.out / f"{name}.txt").write_text("\n".join(report.lines) + "\n")
    (args.out / f"{name}.json").write_text(json.dumps(report.figures, indent=2, default=str))
    print(f"written: {args.out / name}.txt, .json")
    return report.figures


if __name__ == "__main__":
    main()
