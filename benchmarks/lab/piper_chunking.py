"""How to chunk the Piper vocoder: cost per call, talker cost, and quality vs context.

Measures on this CPU, one ONNX Runtime thread per stage (the deployed setting):
- vocoder ms per call for chunk sizes 4..128 frames decoded with 4 + 4 context frames, and
  its real-time factor (audio seconds emitted / seconds spent); a few batch sizes too;
- talker time (phonemes + graph) for a short first fragment and a long sentence;
- SNR of a chunked decode (ramp 8, 16, 32 then 64) against a whole-segment decode, for
  contexts 0..10 frames each side.
Each figure is the median of `--repeats` runs (the CPU may be shared: medians, not means).
From them it estimates the first-chunk latency (talker on the first fragment + the first
vocoder call) and steady capacity for candidate chunkings, and prints a table.

    .venv/bin/python -m benchmarks.lab.piper_chunking [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends.piper import PiperBackend
from pipeline.config import PiperConfig

CHUNK_SIZES_FRAMES = (4, 8, 16, 32, 64, 128)
CONTEXT_PAIRS = (
    *((c, c) for c in (0, 2, 4, 6, 8, 10)),
    (5, 5),
    (4, 6),
    (6, 4),
)  # (left, right) frames
FIRST_CHUNK_SHIFTS = (3, 7, 11, 15, 19)  # first chunk sizes: they move every later seam
BATCH_SIZES = (1, 2, 4)
SHORT_TEXT = "Hello, how are you?"
LONG_TEXT = (
    "The committee met on Tuesday afternoon to review the budget, and after a long "
    "discussion it agreed to fund the new library, the park, and the repairs to the bridge."
)
SNR_TEXTS = (
    "The weather is nice today, and the sun is shining over the quiet harbour.",
    "Please open the window before you leave the room, and lock the door behind you.",
    LONG_TEXT,
)
RAMP = (8, 16, 32)
STEADY_FRAMES = 64


@dataclass(frozen=True)
class Candidate:
    ramp: tuple[int, ...]
    steady_frames: int
    left_frames: int
    right_frames: int


CANDIDATES = (
    Candidate((4, 8, 16, 32), 64, 4, 4),
    Candidate((8, 16, 32), 64, 4, 4),
    Candidate((16, 32), 64, 4, 4),
    Candidate((8, 16, 32, 64), 128, 4, 4),
    Candidate((8, 16, 32), 64, 5, 5),
    Candidate((8, 16, 32), 64, 6, 6),
)


def time_call_ms(call: Callable[[], object], min_calls: int = 5, min_total_s: float = 0.3) -> float:
    """Median wall time of one call, after two warm-up calls."""
    call()
    call()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < min_calls or time.perf_counter() - started < min_total_s:
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(samples)


def talk(backend: PiperBackend, text: str) -> np.ndarray:
    """The talker's frames for `text`, every step of its segment (the flow in chunks)."""
    voice = backend.default_voice()
    segment = backend.open_segment(TalkRequest(text, voice, 1.0, 0, 0, 0))
    pieces = []
    while True:
        (step,) = backend.step([segment])
        pieces.append(step.frames)
        if step.done:
            break
    backend.close_segment(segment)
    return np.concatenate(pieces)


def plan(total: int, ramp: tuple[int, ...], steady: int) -> list[tuple[int, int]]:
    chunks, start, index = [], 0, 0
    while start < total:
        stop = min(total, start + (ramp[index] if index < len(ramp) else steady))
        chunks.append((start, stop))
        start, index = stop, index + 1
    return chunks


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference - test) ** 2))
    return 10.0 * float(np.log10(float(np.sum(reference**2)) / max(noise, 1e-30)))


def chunked_snr_db(
    backend: PiperBackend,
    frames: np.ndarray,
    left: int,
    right: int,
    ramp=RAMP,
    steady=STEADY_FRAMES,
) -> float:
    voice = backend.default_voice()
    (whole,) = backend.vocode([VocodeItem(voice, frames, 0, frames.shape[0])])
    items = []
    for start, stop in plan(frames.shape[0], ramp, steady):
        c0, c1 = max(0, start - left), min(frames.shape[0], stop + right)
        items.append(VocodeItem(voice, frames[c0:c1], start - c0, stop - start))
    return snr_db(whole, np.concatenate(backend.vocode(items)))


def measure_once(backend: PiperBackend) -> dict:
    voice = backend.default_voice()
    long_frames = talk(backend, LONG_TEXT)
    seconds_per_frame = backend.samples_per_frame / backend.sample_rate_hz

    vocoder = {}
    for size in CHUNK_SIZES_FRAMES:
        window = long_frames[100 : 100 + size + 8]
        item = VocodeItem(voice, window, 4, size)
        ms = time_call_ms(lambda item=item: backend.vocode([item]))
        vocoder[size] = {"ms": ms, "rtf": size * seconds_per_frame / (ms / 1000.0)}

    batched = {}
    for size in (16, 64):
        for batch in BATCH_SIZES:
            items = [
                VocodeItem(voice, long_frames[50 * b : 50 * b + size + 8], 4, size)
                for b in range(batch)
            ]
            ms = time_call_ms(lambda items=items: backend.vocode(items))
            batched[f"{size}x{batch}"] = {
                "ms": ms,
                "rtf": batch * size * seconds_per_frame / (ms / 1000.0),
            }

    talker = {}
    for label, text in (("short", SHORT_TEXT), ("long", LONG_TEXT)):
        frames = talk(backend, text).shape[0]
        ms = time_call_ms(lambda text=text: talk(backend, text))
        audio_s = frames * seconds_per_frame
        talker[label] = {
            "ms": ms,
            "frames": frames,
            "audio_s": audio_s,
            "rtf": audio_s / (ms / 1000),
        }
    return {"vocoder": vocoder, "batched": batched, "talker": talker}


def measure_snr(backend: PiperBackend) -> dict:
    """Deterministic (noise 0): no repeats needed.

    Where the seams fall matters (a seam in a loud transient costs more), so each context
    is measured over SNR_TEXTS x FIRST_CHUNK_SHIFTS (the first chunk's size moves every
    later seam), and reported as min / 10th percentile / median of the per-text SNRs.
    """
    latents = [talk(backend, text) for text in SNR_TEXTS]
    table: dict[str, dict[str, float]] = {}
    for left, right in CONTEXT_PAIRS:
        values = [
            chunked_snr_db(backend, f, left, right, ramp=(first, *RAMP[1:]))
            for f in latents
            for first in FIRST_CHUNK_SHIFTS
        ]
        table[f"{left}/{right}"] = _spread(values)
    for candidate in CANDIDATES:
        values = [
            chunked_snr_db(
                backend,
                f,
                candidate.left_frames,
                candidate.right_frames,
                candidate.ramp,
                candidate.steady_frames,
            )
            for f in latents
        ]
        table[_label(candidate)] = _spread(values)
    return table


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min_db": min(values),
        "p10_db": float(np.percentile(values, 10)),
        "median_db": statistics.median(values),
    }


def _label(candidate: Candidate) -> str:
    ramp = ",".join(str(r) for r in candidate.ramp)
    context = f"{candidate.left_frames}/{candidate.right_frames}"
    return f"ramp {ramp} then {candidate.steady_frames}, ctx {context}"


def median_of(runs: list[dict], *keys: str) -> float:
    values = []
    for run in runs:
        value = run
        for key in keys:
            value = value[key]
        values.append(value)
    return statistics.median(values)


def candidate_costs(backend: PiperBackend, candidate: Candidate, talker_short_ms: float) -> dict:
    """First-chunk latency and steady vocoder capacity, timed directly for this candidate."""
    voice = backend.default_voice()
    frames = talk(backend, LONG_TEXT)
    seconds_per_frame = backend.samples_per_frame / backend.sample_rate_hz
    first = candidate.ramp[0] if candidate.ramp else candidate.steady_frames
    first_item = VocodeItem(voice, frames[: first + candidate.right_frames], 0, first)
    first_ms = time_call_ms(lambda: backend.vocode([first_item]))
    steady = candidate.steady_frames
    span = candidate.left_frames + steady + candidate.right_frames
    steady_item = VocodeItem(voice, frames[100 : 100 + span], candidate.left_frames, steady)
    steady_ms = time_call_ms(lambda: backend.vocode([steady_item]))
    return {
        "first_vocoder_ms": first_ms,
        "first_chunk_latency_ms": talker_short_ms + first_ms,
        "first_chunk_audio_ms": first * seconds_per_frame * 1000,
        "steady_ms": steady_ms,
        "steady_rtf": steady * seconds_per_frame / (steady_ms / 1000),
        "context_overhead": (candidate.left_frames + candidate.right_frames) / steady,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()

    load_started = time.perf_counter()
    backend = PiperBackend(
        PiperConfig(talker_intra_op_threads=1, vocoder_intra_op_threads=1),
        noise_scale=0.0,
        noise_w=0.0,
    )
    load_s = time.perf_counter() - load_started
    runs = [measure_once(backend) for _ in range(args.repeats)]
    snr = measure_snr(backend)
    talker_short_ms = median_of(runs, "talker", "short", "ms")
    candidates = {}
    for candidate in CANDIDATES:
        costs = [candidate_costs(backend, candidate, talker_short_ms) for _ in range(args.repeats)]
        candidates[_label(candidate)] = {
            key: statistics.median(c[key] for c in costs) for key in costs[0]
        } | {"snr_min_db": snr[_label(candidate)]["min_db"]}

    print(
        f"backend load (cut graphs cached after the first run): {load_s:.2f} s; "
        f"medians of {args.repeats} runs, 1 thread per stage\n"
    )
    print("| vocoder chunk (frames, +4/+4 ctx) | audio ms | ms per call | RTF (audio/time) |")
    print("|---|---|---|---|")
    for size in CHUNK_SIZES_FRAMES:
        audio_ms = size * backend.samples_per_frame / backend.sample_rate_hz * 1000
        print(
            f"| {size} | {audio_ms:.0f} | {median_of(runs, 'vocoder', size, 'ms'):.1f} | "
            f"{median_of(runs, 'vocoder', size, 'rtf'):.1f}x |"
        )
    print("\n| batched (chunk x batch, +4/+4 ctx) | ms per call | RTF (all items) |")
    print("|---|---|---|")
    for key in runs[0]["batched"]:
        print(
            f"| {key} | {median_of(runs, 'batched', key, 'ms'):.1f} | "
            f"{median_of(runs, 'batched', key, 'rtf'):.1f}x |"
        )
    print("\n| talker (phonemes + graph) | frames | audio s | ms | RTF |")
    print("|---|---|---|---|---|")
    for label, text in (("short", SHORT_TEXT), ("long", LONG_TEXT)):
        print(
            f"| {label}: {text[:40]!r} | {runs[0]['talker'][label]['frames']} | "
            f"{runs[0]['talker'][label]['audio_s']:.2f} | "
            f"{median_of(runs, 'talker', label, 'ms'):.1f} | "
            f"{median_of(runs, 'talker', label, 'rtf'):.1f}x |"
        )
    print(
        f"\n| context left/right (frames), ramp (3..19, 16, 32) then {STEADY_FRAMES} "
        "| SNR min dB | p10 dB | median dB |"
    )
    print("|---|---|---|---|")
    for left, right in CONTEXT_PAIRS:
        value = snr[f"{left}/{right}"]
        print(
            f"| {left}/{right} | {value['min_db']:.1f} | {value['p10_db']:.1f} | "
            f"{value['median_db']:.1f} |"
        )
    print(
        "\n| candidate | first vocoder ms | est. first-chunk latency ms | first audio ms | "
        "steady ms | steady RTF | ctx overhead | SNR min dB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, c in candidates.items():
        print(
            f"| {label} | {c['first_vocoder_ms']:.1f} | {c['first_chunk_latency_ms']:.1f} | "
            f"{c['first_chunk_audio_ms']:.0f} | {c['steady_ms']:.1f} | {c['steady_rtf']:.1f}x | "
            f"{c['context_overhead']:.0%} | {c['snr_min_db']:.1f} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "runs": runs,
                    "snr": {str(k): v for k, v in snr.items()},
                    "candidates": candidates,
                    "candidate_defs": [asdict(c) for c in CANDIDATES],
                },
                handle,
                indent=2,
                default=str,
            )


if __name__ == "__main__":
    main()
