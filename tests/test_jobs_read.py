"""`playhead read FILE -o out.wav` against a real `playhead serve` (sim backend): the
download is stopped (kill -9 of the client) mid-job, and the same command run again picks
up where it stopped; the file is then byte for byte the job's audio."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from test_shutdown import ROOT, free_port, start_server

TEXT = "\n\n".join(
    f"# Part {n}\n\nThis part of the book says a few plain things, one after the other."
    for n in range(8)
)


def _read(base: str, source: Path, output: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYHEAD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "app", "read", str(source), "-o", str(output)]
    argv += ["--server", base, "--voice", "sim", "-q"]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_read_resumes_an_interrupted_download(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(
        port,
        "sim.vocoder_per_frame_ms=8",
        "engine.calibration_calls=0",
        "jobs.segment_chars=80",
        f"jobs.dir={tmp_path / 'jobs'}",
    )
    source = tmp_path / "book.md"
    source.write_text(TEXT)
    output = tmp_path / "book.wav"
    try:
        first = _read(base, source, output)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            not output.exists() or output.stat().st_size < 50_000
        ):
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
        first.communicate()
        state = output.with_name("book.wav.job")
        assert state.exists()
        job_id = json.loads(state.read_text())["id"]
        cut_at = output.stat().st_size
        assert cut_at >= 50_000
        second = _read(base, source, output)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 0, err
        assert not state.exists()
        whole = httpx.get(f"{base}/v1/audio/jobs/{job_id}/audio", timeout=30).content
        assert output.read_bytes() == whole
        job = httpx.get(f"{base}/v1/audio/jobs/{job_id}", timeout=5).json()
        assert job["title"] == "book" and len(job["chapters"]) == 8
        assert len(httpx.get(f"{base}/v1/audio/jobs", timeout=5).json()["data"]) == 1  # one job
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        finally:
            if server.poll() is None:
                server.kill()
            server.communicate()
