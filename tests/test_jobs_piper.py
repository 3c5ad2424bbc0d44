"""A job on the default Piper voice survives kill -9 of its `playhead serve`: restarted on
the same `jobs.dir`, it resumes at its last whole segment, and with noise 0 its audio
equals an uninterrupted render of the same text (each segment the same length; the
samples equal but for chunk seams, which may fall elsewhere under other timing), its
timestamps the text's words once each, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from test_shutdown import ROOT, free_port

pytestmark = pytest.mark.slow

SETTINGS = (
    "piper.noise_scale=0",
    "piper.noise_w=0",
    "engine.calibration_calls=0",
    "jobs.segment_chars=120",
)
TEXT = " ".join(
    f"Paragraph {n} of the story tells what happened next, slowly and clearly." for n in range(8)
)


def _serve(port: int, jobs_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYHEAD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "app", "serve", "--port", str(port)]
    for item in (*SETTINGS, f"jobs.dir={jobs_dir}"):
        argv += ["--set", item]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the server did not become ready: " + proc.communicate()[1])
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _wait(base: str, job_id: str, until: object, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = httpx.get(f"{base}/v1/audio/jobs/{job_id}", timeout=5).json()
        if until(job) or time.monotonic() > deadline:  # type: ignore[operator]
            return job
        time.sleep(0.05)


def _submit(base: str) -> str:
    body = {"input": TEXT, "voice": "alloy", "response_format": "pcm", "sample_rate": 22050}
    response = httpx.post(f"{base}/v1/audio/jobs", json=body, timeout=10)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _segments(jobs_dir: Path, job_id: str) -> list[np.ndarray]:
    files = sorted((jobs_dir / "audio" / job_id).glob("[0-9]*.pcm"))  # not final.pcm
    return [np.fromfile(f, dtype="<i2").astype(np.float32) / 32767 for f in files]


def test_a_piper_job_resumes_after_kill_9(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _serve(port, tmp_path)
    try:
        job_id = _submit(base)
        before = _wait(base, job_id, lambda j: j["progress"]["segments_done"] >= 2)
        assert before["progress"]["segments_done"] < before["progress"]["segments"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
    proc = _serve(port, tmp_path)
    try:
        done = _wait(base, job_id, lambda j: j["state"] in ("done", "failed"))
        assert done["state"] == "done", done
        again = _submit(base)
        assert _wait(base, again, lambda j: j["state"] in ("done", "failed"))["state"] == "done"
        words = httpx.get(f"{base}/v1/audio/jobs/{job_id}/timestamps", timeout=10).json()["words"]
        assert [w["word"] for w in words] == TEXT.split()
        starts = [w["start_s"] for w in words]
        assert starts == sorted(starts)
        whole = httpx.get(f"{base}/v1/audio/jobs/{job_id}/audio", timeout=30).content
    finally:
        _stop(proc)
    resumed, uninterrupted = _segments(tmp_path, job_id), _segments(tmp_path, again)
    assert len(resumed) == len(uninterrupted) == done["progress"]["segments"]
    assert len(whole) == 2 * sum(s.size for s in resumed)  # pcm at the voice's rate
    for index, (a, b) in enumerate(zip(resumed, uninterrupted, strict=True)):
        assert a.size == b.size, f"segment {index}: {a.size} samples against {b.size}"
        error = float(np.sum((a - b) ** 2)) / max(float(np.sum(b**2)), 1e-12)
        assert error < 10 ** (-30 / 10), f"segment {index}: {10 * np.log10(error):.1f} dB"
