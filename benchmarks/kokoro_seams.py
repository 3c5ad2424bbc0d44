"""Kokoro's seams: chunked decoding against the whole decode, seam by seam.

Every Japanese load text (benchmarks/corpus-ja.txt) is talked once and decoded twice:
whole (one vocoder call over the segment) and served (the chunks Piper's default chunking
cuts, the chunking a mixed server runs: ramp 8, 16, 32 then 64 frames, 8 frames of
context each side, context trimmed) through the backend's own `vocode`, which cuts each
chunk from its piece's whole decode (pipeline/backends/kokoro/pieces.py). For comparison,
the same chunks decoded as windows on their own (what a Piper-style vocoder would do).
A seam's SNR: the segment's mean power over the mean power of (served - whole) within 8
frames of the seam; the worst and the median seam are printed per arm. No timing: it
needs no bench lock.

    python -m benchmarks.kokoro_seams [--limit N]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from benchmarks.loadgen import load_corpus
from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends.kokoro.backend import KokoroBackend
from pipeline.backends.kokoro.config import KokoroConfig
from pipeline.text import split_text

CORPUS = Path(__file__).with_name("corpus-ja.txt")
RAMP, STEADY, CONTEXT, WINDOW = (8, 16, 32), 64, 8, 8
HOP = 600


def chunks(count: int) -> list[tuple[int, int]]:
    out, start, index = [], 0, 0
    while start < count:
        size = RAMP[index] if index < len(RAMP) else STEADY
        out.append((start, min(count, start + size)))
        start, index = out[-1][1], index + 1
    return out


def seam_snrs(served: np.ndarray, whole: np.ndarray, seams: list[int]) -> list[float]:
    power = float(np.mean(whole**2)) + 1e-12
    out = []
    for seam in seams:
        lo, hi = max(0, (seam - WINDOW) * HOP), (seam + WINDOW) * HOP
        error = float(np.mean((served[lo:hi] - whole[lo:hi]) ** 2))
        out.append(10 * np.log10(power / error) if error > 0 else float("inf"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kokoro_seams")
    parser.add_argument("--limit", type=int, default=0, help="first N texts (0: all)")
    args = parser.parse_args(argv)
    backend = KokoroBackend(KokoroConfig())
    texts = [s for t in load_corpus(CORPUS) for s in split_text(t, max_segment_phonemes=1600)]
    texts = texts[: args.limit] if args.limit else texts
    arms: dict[str, list[float]] = {"served (piece store)": [], "windows alone": []}
    for text in texts:
        segment = backend.open_segment(TalkRequest(text, "jf_alpha", 1.0, 0, 0, 0))
        (step,) = backend.step([segment])
        frames = step.frames
        whole = np.clip(backend._decode(frames, None), -1, 1)
        cuts = chunks(frames.shape[0])
        seams = [stop for _, stop in cuts[:-1]]
        served, alone = [], []
        for start, stop in cuts:
            left, right = max(0, start - CONTEXT), min(frames.shape[0], stop + CONTEXT)
            item = VocodeItem("jf_alpha", frames[left:right], start - left, stop - start)
            served.append(backend.vocode([item])[0])
            window = np.clip(backend._decode(frames[left:right], None), -1, 1)
            alone.append(window[(start - left) * HOP : (stop - left) * HOP])
        arms["served (piece store)"] += seam_snrs(np.concatenate(served), whole, seams)
        arms["windows alone"] += seam_snrs(np.concatenate(alone), whole, seams)
    print(f"{len(texts)} segments; seams: {len(arms['windows alone'])}\n")
    print("| arm | worst seam dB | median seam dB |\n|---|---|---|")
    for name, values in arms.items():
        print(f"| {name} | {min(values):.1f} | {statistics.median(values):.1f} |")
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
