"""The machine's limit on the bundled voice, for `make bench-voice` (issue #13, item 1).

    python -m benchmarks.voice_limit [--seconds 8] [--layouts 2x1,1x2]

The limit is what this machine can synthesise when nothing is wasted: piper's own whole
model (the uncut graph, pipeline/backends/piper/reference.py), one ONNX Runtime call per
sentence as piper's server makes them, run in P processes of T intra-op threads each,
every process decoding corpus texts back to back. Figure: audio seconds per wall second,
summed over the processes, between a common start and the last process's end. Each
layout P x T is measured in turn and the best is the limit; the default layouts are
"one single-thread process per core" and "one process with a thread per core".

Phonemising (espeak-ng) runs before the clock starts: the limit is the model's, so that
C / limit says how much of the machine the serving pipeline turns into audio.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.loadgen import load_corpus
from pipeline.backends.piper import bundled_model_path


@dataclass(frozen=True)
class LimitRun:
    processes: int
    threads: int
    audio_s: float  # audio synthesised by every process together
    wall_s: float  # from the common start to the last process's end
    calls: int

    @property
    def layout(self) -> str:
        return f"{self.processes}x{self.threads}"

    @property
    def audio_s_per_s(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "layout": self.layout, "audio_s_per_s": self.audio_s_per_s}


def default_layouts(cores: int | None = None) -> list[tuple[int, int]]:
    """One single-thread process per core, and one process with a thread per core."""
    cores = cores or os.cpu_count() or 1
    return list(dict.fromkeys([(cores, 1), (1, cores)]))


def _sentence_ids(texts: Sequence[str]) -> list[list[int]]:
    """Phoneme ids of every sentence of `texts`, as piper's server splits them."""
    from pipeline.backends.piper.phonemes import _espeak_phonemizer, phonemes_to_ids
    from pipeline.backends.piper.voices import load_voice_spec

    spec = load_voice_spec(bundled_model_path())
    phonemizer = _espeak_phonemizer()
    out: list[list[int]] = []
    for text in texts:
        for sentence in phonemizer.phonemize(
            spec.espeak_voice, text, vowel_clusters=spec.vowel_clusters
        ):
            if sentence:
                out.append(phonemes_to_ids(spec, list(sentence)))
    return out


def measure_layout(
    processes: int,
    threads: int,
    sentences: list[list[int]],
    *,
    seconds: float,
    load_timeout_s: float = 120.0,
) -> LimitRun:
    """P processes of T threads, each decoding sentences for `seconds` from a common start."""
    from pipeline.backends.piper.voices import load_voice_spec

    spec = load_voice_spec(bundled_model_path())
    scales = (spec.noise_scale, spec.length_scale, spec.noise_w)
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    # the common start, published (and the gate opened) once every process has loaded
    start_at, gate = context.Value("d", 0.0), context.Event()
    procs = []
    for index in range(processes):
        proc = context.Process(
            target=_process,
            args=(index, threads, sentences, scales, spec.sample_rate_hz, start_at, seconds,
                  gate, ready, results),
        )  # fmt: skip
        proc.start()
        procs.append(proc)
    try:
        loaded, deadline_s = 0, time.monotonic() + load_timeout_s
        while loaded < processes:
            try:
                ready.get(timeout=0.5)
                loaded += 1
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode is not None]
                if dead or time.monotonic() > deadline_s:
                    raise RuntimeError(
                        f"machine limit: {processes - loaded} of {processes} processes did not "
                        f"load the model (exit codes {dead})"
                    ) from None
        start_at.value = time.time() + 0.2
        gate.set()
        outcomes = [results.get(timeout=seconds + load_timeout_s) for _ in range(processes)]
    finally:
        for proc in procs:
            proc.join(timeout=10.0)
            if proc.is_alive():
                proc.terminate()
    audio_s = sum(o[0] for o in outcomes)
    calls = sum(o[1] for o in outcomes)
    wall_s = max(o[2] for o in outcomes) - start_at.value
    return LimitRun(processes, threads, audio_s, wall_s, calls)


def _process(
    index: int,
    threads: int,
    sentences: list[list[int]],
    scales: tuple[float, float, float],
    sample_rate_hz: int,
    start_at: Any,
    seconds: float,
    gate: Any,
    ready: Any,
    results: Any,
) -> None:
    """One process: load the whole model and warm it, say so, wait for the gate, then
    synthesise sentences (each process from its own offset) from the common start for
    `seconds`; report (audio_s, calls, end time)."""
    from pipeline.backends.piper.reference import synthesize_whole, whole_model_session

    noise_scale, length_scale, noise_w = scales
    session = whole_model_session(bundled_model_path(), intra_op_threads=threads)
    synthesize_whole(session, sentences[0], noise_scale=noise_scale, length_scale=length_scale,
                     noise_w=noise_w)  # fmt: skip  # the first call allocates
    ready.put(index)
    gate.wait()
    begin_s = start_at.value
    while time.time() < begin_s:
        time.sleep(0.001)
    audio_s, calls, position = 0.0, 0, index * 7
    while time.time() < begin_s + seconds:
        ids = sentences[position % len(sentences)]
        position += 1
        audio = synthesize_whole(
            session, ids, noise_scale=noise_scale, length_scale=length_scale, noise_w=noise_w
        )
        audio_s += audio.size / sample_rate_hz
        calls += 1
    results.put((audio_s, calls, time.time()))


def measure_limit(
    texts: Sequence[str] | None = None,
    *,
    seconds: float = 8.0,
    layouts: Sequence[tuple[int, int]] | None = None,
) -> tuple[LimitRun, list[LimitRun]]:
    """(the best layout's run, every layout's run)."""
    sentences = _sentence_ids(texts if texts is not None else load_corpus())
    runs = [
        measure_layout(p, t, sentences, seconds=seconds) for p, t in layouts or default_layouts()
    ]
    return max(runs, key=lambda r: r.audio_s_per_s), runs


def _layouts(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        p, t = part.strip().lower().split("x")
        out.append((int(p), int(t)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.voice_limit")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per layout")
    parser.add_argument(
        "--layouts", type=_layouts, default=None, help="PxT,... (processes x threads)"
    )
    args = parser.parse_args(argv)
    best, runs = measure_limit(seconds=args.seconds, layouts=args.layouts)
    for run in runs:
        print(f"{run.layout}: {run.audio_s_per_s:.2f} audio s per s ({run.audio_s:.1f} s in "
              f"{run.wall_s:.2f} s, {run.calls} calls)")  # fmt: skip
    print(f"limit = {best.audio_s_per_s:.2f} audio s per s ({best.layout})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
