"""A long text as a job, alone on the server: its render rate against the machine's limit.

Starts `playhead serve` (the default Piper voice unless --set says otherwise), waits for
its start-up calibration (the capacity C it sustains saturated, audio s per s), submits
a text of --chars characters (the corpus' lines, repeated) as one job, and prints the audio
made per wall second, beside C and as a share of it (target >= 0.9). Run it under the
bench lock: `flock /tmp/playhead-bench.lock python -m benchmarks.jobs_render`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def corpus_text(chars: int) -> str:
    lines = [
        line.strip()
        for line in (ROOT / "benchmarks" / "corpus.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    out: list[str] = []
    size = 0
    while size < chars:
        for line in lines:
            out.append(line)
            size += len(line) + 1
            if size >= chars:
                break
    return " ".join(out)[:chars].rsplit(" ", 1)[0]


def metric(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--port", type=int, default=8371)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYHEAD_")}
    with tempfile.TemporaryDirectory() as jobs_dir:
        argv = [sys.executable, "-m", "app", "serve", "--port", str(args.port)]
        for item in [*args.overrides, f"jobs.dir={jobs_dir}"]:
            argv += ["--set", item]
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            capacity = metric(base, "playhead_capacity_audio_seconds_per_second")
            text = corpus_text(args.chars)
            started = time.monotonic()
            response = httpx.post(
                f"{base}/v1/audio/jobs",
                json={"input": text, "voice": "alloy", "response_format": "mp3"},
                timeout=30,
            )
            response.raise_for_status()
            job_id = response.json()["id"]
            while True:
                job = httpx.get(f"{base}/v1/audio/jobs/{job_id}", timeout=10).json()
                if job["state"] in ("done", "failed"):
                    break
                time.sleep(0.5)
            wall_s = time.monotonic() - started
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    audio_s = job["progress"]["audio_seconds"]
    rate = audio_s / wall_s
    result = {
        "chars": len(text),
        "state": job["state"],
        "audio_s": audio_s,
        "wall_s": round(wall_s, 2),
        "render_rate_audio_s_per_s": round(rate, 2),
        "calibrated_capacity_audio_s_per_s": round(capacity, 2),
        "share_of_capacity": round(rate / capacity, 3) if capacity > 0 else None,
    }
    print(json.dumps(result, indent=2))
    return 0 if job["state"] == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
