"""SIGTERM to `playhead serve --replicas 1`: the stream in flight ends whole (the drain),
the process exits 0, and nothing of the local Ray it started is left: every process in
its tree, listed while it serves, is gone afterwards (Ray's DashboardAgent and
RuntimeEnvAgent were seen to outlive a stop as orphans that ignore SIGTERM).

Each try starts a local Ray (~15 s here); PLAYHEAD_STOP_TRIES sets how many (default 1, to
keep `make test` short; `PLAYHEAD_STOP_TRIES=10` is the repeat run, docs/scale-out.md has
its last count). Needs the `cluster` extra (ray[serve])."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from tests.api_support import expected_audio_s, sim_settings, speech_body  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRIES = int(os.environ.get("PLAYHEAD_STOP_TRIES", "1"))
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
TEXT = "This sentence is spoken while the server is asked to stop. " * 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tree(pid: int) -> dict[int, str]:
    """The process and its descendants: pid -> name (as `ps` shows it)."""
    root = psutil.Process(pid)
    found = {}
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            found[process.pid] = " ".join(process.cmdline()[:1]) or process.name()
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "playhead serve --replicas exited before it was ready"
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    pytest.fail("the cluster did not become ready")


@pytest.mark.parametrize("attempt", range(TRIES))
def test_sigterm_drains_and_leaves_no_ray_process(tmp_path: Path, attempt: int) -> None:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = ["serve", "--replicas", "1", "--port", str(port), "--set", "backend.kind=sim"]
    argv += ["--set", "server.log_level=warning", "--set", "server.shutdown_grace_s=10"]
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *argv], cwd=tmp_path, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    tree: dict[int, str] = {}
    try:
        _wait_ready(url, proc)
        tree = _tree(proc.pid)
        assert any("raylet" in name for name in tree.values()), tree  # a local Ray: ours
        with httpx.Client(timeout=30) as client:
            body = speech_body(TEXT, response_format="pcm")
            with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
                assert response.status_code == 200
                chunks = response.iter_bytes()
                audio = bytearray(next(chunks))  # the stream is in flight
                proc.send_signal(signal.SIGTERM)
                for chunk in chunks:
                    audio += chunk
        assert proc.wait(STOP_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        print((tmp_path / "serve.log").read_text(errors="replace")[-4000:])
    # the stream in flight played to its end
    expected_s = expected_audio_s(sim_settings(), TEXT)
    assert len(audio) / 2 / 24000 == pytest.approx(expected_s, abs=0.05)
    deadline = time.monotonic() + 5.0  # the last ones are reaped
    left = {pid: name for pid, name in tree.items() if _alive(pid)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {pid: name for pid, name in tree.items() if _alive(pid)}
    assert not left, f"left running after the stop: {left}"
    assert "Traceback" not in (tmp_path / "serve.log").read_text(errors="replace")


def _ready_ray_head(proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "ray start --head exited: " + log.read_text()[-2000:]
        if "Ray runtime started" in log.read_text(errors="replace"):
            return
        time.sleep(0.3)
    pytest.fail("the Ray head did not start")


def test_joined_to_a_cluster_it_stops_only_what_it_started(tmp_path: Path) -> None:
    """`cluster.ray_address`: SIGTERM ends Playhead's application (and the Serve it
    started) but leaves the cluster, every process of its head, running."""
    ray_port, port = _free_port(), _free_port()
    # no token: the driver would look for the head's in Ray's default temp dir
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled"
    )
    ray_bin = str(Path(sys.executable).with_name("ray"))
    head_argv = [ray_bin, "start", "--head", "--block", f"--port={ray_port}", "--num-cpus=2"]
    # a short temp dir: Ray's unix socket paths under pytest's tmp_path pass 107 bytes
    temp_dir = tempfile.mkdtemp(prefix="ph-ray-", dir="/tmp")
    head_argv += ["--include-dashboard=false", f"--temp-dir={temp_dir}"]
    head_log = (tmp_path / "head.log").open("wb")
    head = subprocess.Popen(head_argv, cwd=tmp_path, env=env, stdout=head_log, stderr=head_log)
    serve_log = (tmp_path / "serve.log").open("wb")
    proc: subprocess.Popen[bytes] | None = None
    cluster: dict[int, str] = {}
    try:
        _ready_ray_head(head, tmp_path / "head.log")
        cluster.update(_tree(head.pid))
        argv = ["serve", "--replicas", "1", "--port", str(port), "--set", "backend.kind=sim"]
        argv += ["--set", f"cluster.ray_address=127.0.0.1:{ray_port}"]
        argv += ["--set", "server.log_level=warning"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", *argv],
            cwd=tmp_path,
            env=env,
            stdout=serve_log,
            stderr=serve_log,
        )
        _wait_ready(f"http://127.0.0.1:{port}", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0
        assert head.poll() is None  # the cluster runs on
        gone = {pid: name for pid, name in cluster.items() if not _alive(pid)}
        assert not gone, f"processes of the cluster it joined were stopped: {gone}"
        with pytest.raises(httpx.TransportError):  # its proxy (Serve, which it started) is gone
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        # the head this test started, all of it (SIGTERM would drain it for 30 s)
        for pid in {*cluster, *_tree(head.pid)} if head.poll() is None else cluster:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
        head_log.close()
        serve_log.close()
        print((tmp_path / "serve.log").read_text(errors="replace")[-3000:])
    assert "Traceback" not in (tmp_path / "serve.log").read_text(errors="replace")


def test_a_process_left_after_the_shutdown_that_ignores_sigterm_is_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The net under ray.shutdown(): a leftover (as the DashboardAgent was seen, an orphan
    ignoring SIGTERM) gets SIGTERM, then SIGKILL, and one log line names it."""
    from app.cluster import launch

    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(600)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        with caplog.at_level("WARNING", logger="playhead.cluster"):
            launch._end_leftovers([psutil.Process(stubborn.pid)])
        assert not _alive(stubborn.pid)  # ended (and reaped) by then
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()
    (line,) = [r.getMessage() for r in caplog.records]
    assert (
        line.startswith("ended 1 Ray process(es) left after its shutdown")
        and "1 needed SIGKILL" in line
    )
