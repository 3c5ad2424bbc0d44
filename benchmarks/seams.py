"""The seam sweep: how far chunked synthesis is from whole-segment synthesis, seam by seam.

Every sentence of the sweep (benchmarks/corpus.txt's sentences plus
benchmarks/seam_sentences.txt: 200+ sentences of varied length and punctuation) is
synthesised twice with noise 0:

- whole: the talker over the whole sentence (the flow run once over every frame), then
  one vocoder call over every frame;
- served: what the engine does at the given settings: the talker's steps (the flow in
  chunks with its context), then the vocoder chunk by chunk as the chunk planner cuts it
  (the ramp of a stream's first segment on even sentences, the steady chunks of a later
  segment on odd ones, so that seams fall at every kind of position), context trimmed.

A seam is a chunk boundary of the vocoder or of the flow. Its SNR is the sentence's mean
power over the mean power of (served - whole) within `window_frames` of the seam on each
side: the error a seam leaves, against the level of the speech around it (a seam in a
pause is not graded against the pause's silence). The sweep reports the worst and the
median seam, the worst whole-sentence SNR, and the vocoder's time for the served chunks
against the whole decodes (the cost of the context).

    python -m benchmarks.seams [--contexts 4,6,8] [--limit N] [--set section.field=value]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from app.settings import load_settings
from pipeline.backend import TalkRequest, VocodeItem
from pipeline.backends.piper import PiperBackend
from pipeline.text import split_text
from scheduling import ChunkingConfig

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "corpus.txt"
SEAM_SENTENCES = ROOT / "benchmarks" / "seam_sentences.txt"
CONFIG = ROOT / "configs" / "default.yaml"
WINDOW_FRAMES = 8  # frames each side of a seam whose error is graded
TARGET_DB = 40.0


def _lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in text if line.strip() and not line.startswith("#")]


def sweep_sentences() -> list[str]:
    """The sweep's sentences: corpus.txt cut into sentences, then seam_sentences.txt."""
    corpus = [
        sentence
        for text in _lines(CORPUS)
        for sentence in split_text(text, first_fragment_words=0, max_segment_chars=10_000)
    ]
    return corpus + _lines(SEAM_SENTENCES)


@dataclass(frozen=True)
class SeamSweep:
    """One sweep's figures (dB: higher is closer to whole-segment synthesis)."""

    sentences: int
    seams: int
    worst_db: float
    median_db: float
    p10_db: float
    worst_sentence_db: float
    worst_text: str
    vocoder_s: float  # served chunks, context included
    whole_vocoder_s: float  # the same sentences decoded whole
    audio_s: float

    @property
    def vocoder_cost(self) -> float:
        """Vocoder time of the served chunks over that of whole decodes."""
        return self.vocoder_s / self.whole_vocoder_s if self.whole_vocoder_s else float("nan")

    def line(self) -> str:
        return (
            f"seams {self.seams} in {self.sentences} sentences: worst {self.worst_db:.1f} dB, "
            f"p10 {self.p10_db:.1f} dB, median {self.median_db:.1f} dB; worst sentence "
            f"{self.worst_sentence_db:.1f} dB; vocoder {self.vocoder_s:.2f} s for "
            f"{self.audio_s:.1f} s of audio ({self.vocoder_cost:.2f}x a whole decode)"
        )


def chunk_layout(total: int, chunking: ChunkingConfig, first_index: int) -> list[tuple[int, int]]:
    """The planner's (start, stop) chunks of a whole segment whose first chunk is the
    stream's chunk number `first_index` (0: the stream's first segment, with the ramp)."""
    chunks: list[tuple[int, int]] = []
    start, index = 0, first_index
    while start < total:
        stop = min(total, start + chunking.target_frames(index))
        chunks.append((start, stop))
        start, index = stop, index + 1
    return chunks


def served_frames(backend: PiperBackend, text: str) -> tuple[np.ndarray, list[int]]:
    """The talker's frames step by step, and where its steps' chunks meet."""
    voice = backend.default_voice()
    segment = backend.open_segment(TalkRequest(text, voice, 1.0, 0, 0, 0))
    pieces = []
    try:
        while True:
            (step,) = backend.step([segment])
            pieces.append(step.frames)
            if step.done:
                break
    finally:
        backend.close_segment(segment)
    bounds = np.cumsum([len(p) for p in pieces])[:-1]
    return np.concatenate(pieces), [int(b) for b in bounds]


def _timed_vocode(backend: PiperBackend, items: list[VocodeItem]) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    pcm = [backend.vocode([item])[0] for item in items]  # one chunk per call, as served
    return np.concatenate(pcm), time.perf_counter() - started


def seam_snrs_db(
    whole: np.ndarray, served: np.ndarray, seams: Sequence[int], hop: int, window_frames: int
) -> list[float]:
    """Each seam's SNR (see the module doc); `seams` in frames."""
    power = float(np.mean(whole.astype(np.float64) ** 2))
    error = (served.astype(np.float64) - whole) ** 2
    out = []
    for seam in seams:
        lo, hi = max(0, (seam - window_frames) * hop), min(whole.size, (seam + window_frames) * hop)
        noise = float(np.mean(error[lo:hi]))
        out.append(10.0 * np.log10(power / max(noise, 1e-30)))
    return out


def sweep(
    backend: PiperBackend,
    chunking: ChunkingConfig,
    sentences: Sequence[str] | None = None,
    *,
    window_frames: int = WINDOW_FRAMES,
) -> SeamSweep:
    """The seam sweep at these settings (`backend` with noise 0; see the module doc)."""
    sentences = list(sweep_sentences() if sentences is None else sentences)
    voice = backend.default_voice()
    hop = backend.samples_per_frame
    scales = backend.scales(voice)
    all_seams: list[float] = []
    worst_sentence, worst_text = float("inf"), ""
    vocoder_s = whole_s = audio_frames = 0.0
    for index, text in enumerate(sentences):
        ids = backend.phoneme_ids(voice, text)
        if not ids:
            continue
        reference = backend.talk_ids(voice, ids, scales)
        started = time.perf_counter()
        (whole,) = backend.vocode([VocodeItem(voice, reference, 0, reference.shape[0])])
        whole_s += time.perf_counter() - started
        frames, flow_seams = served_frames(backend, text)
        total = frames.shape[0]
        layout = chunk_layout(total, chunking, 0 if index % 2 == 0 else len(chunking.ramp))
        items = []
        for start, stop in layout:
            first = max(0, start - chunking.left_context_frames)
            last = min(total, stop + chunking.right_context_frames)
            items.append(VocodeItem(voice, frames[first:last], start - first, stop - start))
        served, seconds = _timed_vocode(backend, items)
        vocoder_s += seconds
        audio_frames += total
        seams = sorted({start for start, _ in layout[1:]} | set(flow_seams))
        all_seams += seam_snrs_db(whole, served, seams, hop, window_frames)
        noise = float(np.sum((served.astype(np.float64) - whole) ** 2))
        energy = float(np.sum(whole.astype(np.float64) ** 2))
        sentence_db = 10.0 * np.log10(energy / max(noise, 1e-30))
        if sentence_db < worst_sentence:
            worst_sentence, worst_text = sentence_db, text
    return SeamSweep(
        sentences=len(sentences),
        seams=len(all_seams),
        worst_db=float(min(all_seams)),
        median_db=float(statistics.median(all_seams)),
        p10_db=float(np.percentile(all_seams, 10)),
        worst_sentence_db=float(worst_sentence),
        worst_text=worst_text,
        vocoder_s=vocoder_s,
        whole_vocoder_s=whole_s,
        audio_s=audio_frames * hop / backend.sample_rate_hz,
    )


def default_sweep(
    config: Path = CONFIG, overrides: Sequence[str] = (), *, limit: int = 0
) -> SeamSweep:
    """The sweep at a config's settings (configs/default.yaml: the deployed ones); `limit`:
    only the first sentences (0: all)."""
    settings = load_settings(config, overrides=list(overrides))
    backend = PiperBackend(settings.piper, noise_scale=0.0, noise_w=0.0)
    sentences = sweep_sentences()
    try:
        return sweep(backend, settings.chunking, sentences[:limit] if limit else sentences)
    finally:
        backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.seams", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="section.field=value"
    )
    parser.add_argument(
        "--contexts", default="", help="vocoder context frames (each side) to compare, e.g. 4,6,8"
    )
    parser.add_argument("--limit", type=int, default=0, help="only the first N sentences")
    args = parser.parse_args(argv)
    settings = load_settings(args.config, overrides=args.overrides)
    backend = PiperBackend(settings.piper, noise_scale=0.0, noise_w=0.0)
    sentences = sweep_sentences()
    if args.limit:
        sentences = sentences[: args.limit]
    contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    chunkings = [settings.chunking] + [
        replace(settings.chunking, left_context_frames=c, right_context_frames=c) for c in contexts
    ]
    for chunking in chunkings:
        result = sweep(backend, chunking, sentences)
        label = (
            f"vocoder context {chunking.left_context_frames}/{chunking.right_context_frames}, "
            f"flow context {settings.piper.flow_context_frames}"
        )
        verdict = "meets" if result.worst_db >= TARGET_DB else "misses"
        print(f"{label}: {result.line()} [{verdict} {TARGET_DB:.0f} dB]", flush=True)
        print(f"  worst sentence: {result.worst_text!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
