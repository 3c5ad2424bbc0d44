"""`playhead say`: a real server (sim backend, and the default voice in a slow test) spoken
through into files and standard output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from tests.api_support import (
    SLOW_TALKER,
    LiveServer,
    decode,
    expected_audio_s,
    live_server,
    sim_settings,
)

ROOT = Path(__file__).resolve().parent.parent
VOICE_START_S = 120.0
TEXT = "Hello there. This is a test of the say command."


@pytest.fixture(autouse=True)
def no_playhead_env(monkeypatch):
    for name in ("PLAYHEAD_API_KEY", "PLAYHEAD_SERVER"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def server():
    settings = sim_settings("admission.enabled=false")
    with live_server(settings) as live:
        yield live


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("out.wav", "wav"),
        ("out.mp3", "mp3"),
        ("out.opus", "opus"),
        ("out.ogg", "opus"),
        ("out.aac", "aac"),
        ("out.FLAC", "flac"),
        ("out.pcm", "pcm"),
    ],
)
def test_say_writes_the_format_of_the_extension(server, tmp_path, capsys, name, fmt):
    out = tmp_path / name
    assert main(["say", TEXT, "-o", str(out), "--server", server.base_url]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"playhead: wrote {out} ({fmt},"), err
    audio, rate_hz = decode(out.read_bytes(), fmt)
    want_s = expected_audio_s(server.settings, TEXT)
    extra_s = 0.1 if fmt in ("mp3", "aac") else 0.002  # priming and padding
    assert want_s - 0.002 <= audio.size / rate_hz <= want_s + extra_s
    assert not list(tmp_path.glob("*.part"))


def test_say_speed_voice_and_format_reach_the_server(server, tmp_path, capsys):
    out = tmp_path / "audio.bin"
    argv = ["say", TEXT, "-o", str(out), "--format", "wav", "--speed", "2", "--voice", "sim"]
    assert main([*argv, "--server", server.base_url, "--sample-rate", "16000", "-q"]) == 0
    assert capsys.readouterr().err == ""
    audio, rate_hz = decode(out.read_bytes(), "wav")
    assert rate_hz == 16000
    want_s = expected_audio_s(server.settings, TEXT, speed=2.0)
    assert audio.size / rate_hz == pytest.approx(want_s, abs=0.002)


def test_say_to_stdout_streams_before_the_request_ends(tmp_path):
    """A slow talker (~10 s of audio in ~2.5 s): the player has audio while `say` still runs."""
    settings = sim_settings(*SLOW_TALKER, "admission.enabled=false")
    text = "One two three four five six seven eight nine ten. " * 3
    with live_server(settings) as live:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "say", text, "-o", "-", "--server", live.base_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            header = proc.stdout.read(44)
            first_s = time.monotonic()
            first = os.read(proc.stdout.fileno(), 65536)
            rest = proc.stdout.read()
            end_s = time.monotonic()
            rc = proc.wait(30)
        finally:
            proc.kill()
            proc.wait()
    assert header.startswith(b"RIFF") and first
    # the talker takes ~2.5 s for this text: audio came out long before the body ended
    assert end_s - first_s > 1.0, "no audio reached stdout before the request ended"
    assert rc == 0, proc.stderr.read()
    audio, rate_hz = decode(header + first + rest, "wav")
    assert audio.size / rate_hz == pytest.approx(expected_audio_s(settings, text), abs=0.002)


def test_no_server_is_one_line_saying_how_to_start_one(tmp_path, capsys):
    out = tmp_path / "x.wav"
    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["say", "hi", "-o", str(out), "--server", url]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make serve" in err and url in err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_4xx_prints_the_servers_message(server, tmp_path, capsys):
    out = tmp_path / "x.wav"
    assert main(["say", "hi", "-o", str(out), "--server", server.base_url, "--speed", "9"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "HTTP 400" in err and "Invalid 'speed'" in err
    assert not list(tmp_path.iterdir())


def test_api_key_from_the_flag_or_the_environment(tmp_path, capsys, monkeypatch):
    settings = sim_settings("server.api_key=sekrit", "admission.enabled=false")
    out = tmp_path / "x.wav"
    with live_server(settings) as live:
        assert main(["say", "hi", "-o", str(out), "--server", live.base_url]) == 1
        err = capsys.readouterr().err
        assert "HTTP 401" in err and "PLAYHEAD_API_KEY" in err
        assert not out.exists()
        assert (
            main(["say", "hi", "-o", str(out), "--server", live.base_url, "--api-key", "no"]) == 1
        )
        assert "HTTP 401" in capsys.readouterr().err
        monkeypatch.setenv("PLAYHEAD_API_KEY", "sekrit")
        assert main(["say", "hi", "-o", str(out), "--server", live.base_url, "-q"]) == 0
    assert decode(out.read_bytes(), "wav")[0].size > 0


def test_unknown_extension_is_a_usage_error(tmp_path, capsys):
    assert main(["say", "hi", "-o", str(tmp_path / "x.xyz")]) == 2
    err = capsys.readouterr().err
    assert ".mp3" in err and "--format" in err


def test_text_from_stdin(server, tmp_path, monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(TEXT))
    out = tmp_path / "x.wav"
    assert main(["say", "-", "-o", str(out), "--server", server.base_url, "-q"]) == 0
    audio, rate_hz = decode(out.read_bytes(), "wav")
    assert audio.size / rate_hz == pytest.approx(expected_audio_s(server.settings, TEXT), abs=0.002)


@contextmanager
def _voice_server(settings):
    """A live server of the real voice: loading it takes a while on a busy machine."""
    live = LiveServer(settings)
    live.start(timeout_s=VOICE_START_S)
    try:
        yield live
    finally:
        live.stop()


@pytest.mark.slow
def test_say_on_the_default_voice_is_heard(tmp_path, capsys):
    from app.settings import load_settings
    from tests.asr import transcribe, word_error_rate

    settings = load_settings(
        ROOT / "configs" / "default.yaml",
        [
            "backend.kind=piper",
            "server.log_level=warning",
            "admission.enabled=false",
            "engine.calibration_calls=0",
        ],
        environ={},
    )
    text = "The quick brown fox jumps over the lazy dog."
    out = tmp_path / "fox.mp3"
    started = time.monotonic()
    with _voice_server(settings) as live:
        assert main(["say", text, "-o", str(out), "--server", live.base_url]) == 0
    assert time.monotonic() - started < 120
    audio, rate_hz = decode(out.read_bytes(), "mp3")
    assert rate_hz == 24000 and 1.5 < audio.size / rate_hz < 6
    assert np.max(np.abs(audio)) > 0.05
    heard = transcribe(audio, rate_hz)
    assert word_error_rate(text, heard) <= 0.35, heard


def test_a_stream_cut_midway_leaves_no_file(tmp_path, capsys):
    from tests.test_faults import RaisingSim

    settings = sim_settings("scheduling.active_stream_window=1", "admission.enabled=false")
    text = "BOOM This stream is long enough to need several chunks of audio. " * 3
    out = tmp_path / "cut.wav"
    with live_server(settings, backend_factory=lambda: RaisingSim(settings.sim)) as live:
        assert main(["say", text, "-o", str(out), "--server", live.base_url]) == 1
    # (the in-process server's uvicorn logs the cut on the same stderr)
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("playhead")]
    assert len(ours) == 1 and "broke after" in ours[0] and "was not written" in ours[0], ours
    assert not list(tmp_path.iterdir())  # neither the file nor its .part
