"""Pauses inside a sentence: served over HTTP against the whole-sentence synthesis.

A pause is a run of 10 ms windows whose RMS is at least `SILENCE_DB` below the loudest
window of the utterance; the longest internal pause is the longest such run between the
first and the last window that is not silent (leading and trailing silence excluded).

`python -m benchmarks.lab.pauses` starts Playhead (configs/default.yaml, noise 0, a port of
--port), sends each sentence as its own request (so each is a stream's first sentence,
where a first-fragment cut would fall), and prints, per sentence, the longest internal
pause of the served audio and of the uncut Piper graph run on the whole sentence.

    python -m benchmarks.lab.pauses [--set section.field=value ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np

WINDOW_S = 0.010
SILENCE_DB = 40.0
ROOT = Path(__file__).resolve().parents[2]

# First sentences of several lengths, with and without clause punctuation.
SENTENCES = (
    "Before you leave the house this morning, please remember to switch off the oven, "
    "close the windows in the back bedroom, feed the cat, water the plants and lock the "
    "side gate behind you.",
    "The committee that met yesterday afternoon in the small room above the library agreed "
    "after a long and sometimes heated discussion that the summer festival should move to "
    "the park by the river.",
    "Although the forecast promised clear skies for the whole weekend, a band of heavy rain "
    "swept in from the west on Saturday morning.",
    "My brother bought a new car last week and drove it all the way to the coast.",
    "We will meet at the station at half past seven and then take the bus to the old town "
    "hall together.",
    "Please call me back tomorrow morning after nine o'clock.",
    # its first clause ends after 15 words: the first fragment is cut there
    "When the old lighthouse keeper finally climbed the narrow spiral stairs for the last "
    "time, he paused at every window to look out over the grey water.",
)


def longest_internal_pause_s(
    pcm: np.ndarray, rate_hz: int, *, silence_db: float = SILENCE_DB, window_s: float = WINDOW_S
) -> float:
    """The longest internal pause of mono `pcm` in seconds (see the module doc)."""
    size = max(1, round(window_s * rate_hz))
    count = pcm.size // size
    if count == 0:
        return 0.0
    windows = pcm[: count * size].astype(np.float64).reshape(count, size)
    rms = np.sqrt(np.mean(windows**2, axis=1))
    loud = rms > rms.max() * 10.0 ** (-silence_db / 20.0)
    voiced = np.flatnonzero(loud)
    if voiced.size == 0:
        return 0.0
    longest = run = 0
    for is_loud in loud[voiced[0] : voiced[-1] + 1]:
        run = 0 if is_loud else run + 1
        longest = max(longest, run)
    return longest * size / rate_hz


def served_pcm(base_url: str, text: str, rate_hz: int) -> np.ndarray:
    """One request's audio, pcm at the voice's own rate."""
    response = httpx.post(
        base_url + "/v1/audio/speech",
        json={
            "model": "tts-1",
            "input": text,
            "voice": "alloy",
            "response_format": "pcm",
            "sample_rate": rate_hz,
        },
        timeout=120,
    )
    response.raise_for_status()
    return np.frombuffer(response.content, dtype="<i2").astype(np.float32) / 32768.0


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    from app.settings import load_settings
    from benchmarks.bench import server_process
    from pipeline.backends.piper import PiperBackend, synthesize_whole
    from pipeline.backends.piper.reference import whole_model_session

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lab.pauses", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--port", type=int, default=8210)
    parser.add_argument("--log", type=Path, default=Path("/dev/null"))
    args = parser.parse_args(argv)
    overrides = [
        "server.log_level=warning",
        "piper.noise_scale=0",
        "piper.noise_w=0",
        *args.overrides,
    ]
    settings = load_settings(args.config, overrides)
    backend = PiperBackend(settings.piper)
    voice = backend.default_voice()
    rate_hz = backend.sample_rate_hz
    session = whole_model_session(backend.voice_spec(voice).model_path)
    noise_scale, length_scale, noise_w = backend.scales(voice)
    print("| sentence | words | served longest pause ms | whole-sentence ms |")
    print("|---|---|---|---|")
    command = [sys.executable, "-m", "app", "serve", "--config", str(args.config)]
    command += ["--port", str(args.port), *(f"--set={item}" for item in overrides)]
    with server_process(command, args.port, args.log) as url:
        for text in SENTENCES:
            served = served_pcm(url, text, rate_hz)
            whole = synthesize_whole(
                session,
                backend.phoneme_ids(voice, text),
                noise_scale=noise_scale,
                length_scale=length_scale,
                noise_w=noise_w,
            )
            print(
                f"| {text[:40]!r} | {len(text.split())} | "
                f"{longest_internal_pause_s(served, rate_hz) * 1000:.0f} | "
                f"{longest_internal_pause_s(whole, rate_hz) * 1000:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
