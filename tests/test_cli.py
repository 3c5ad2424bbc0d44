"""The `playhead` command line: `config` prints effective settings; errors exit 2 on one line."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from app.cli import WYOMING_WITH_REPLICAS, main
from app.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No PLAYHEAD_ variables from the caller, and a working directory without configs/."""
    for name in list(os.environ):
        if name.startswith("PLAYHEAD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def printed_config(capsys, *argv: str) -> dict:
    assert main(["config", *argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return yaml.safe_load(out)


def test_config_without_a_file_prints_the_packaged_default_yaml(capsys):
    # the working directory is an empty temp dir (the autouse fixture)
    data = printed_config(capsys)
    assert data == load_settings(CONFIGS / "default.yaml", environ={}).model_dump(mode="json")
    assert data == Settings().model_dump(mode="json")
    assert data["scheduling"]["active_stream_window"] == 1


def test_the_command_runs_the_packaged_defaults_from_any_directory(tmp_path):
    (tmp_path / "configs").mkdir()  # a stray configs/default.yaml here is not read
    (tmp_path / "configs" / "default.yaml").write_text("server: {port: 1234}\n")
    result = run_cli("config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = load_settings(CONFIGS / "default.yaml", environ={})
    assert yaml.safe_load(result.stdout) == expected.model_dump(mode="json")


def test_config_file_from_playhead_config_variable(capsys, monkeypatch):
    monkeypatch.setenv("PLAYHEAD_CONFIG", str(CONFIGS / "sim.yaml"))
    assert printed_config(capsys)["backend"]["kind"] == "sim"


def test_config_shows_overrides(capsys, monkeypatch):
    monkeypatch.setenv("PLAYHEAD_SERVER__PORT", "9001")
    data = printed_config(
        capsys,
        "--config",
        str(CONFIGS / "sim.yaml"),
        "--set",
        "scheduling.active_stream_window=2",
        "--set",
        "chunking.ramp=[1, 2]",
    )
    assert data["backend"]["kind"] == "sim"
    assert data["server"]["port"] == 9001
    assert data["scheduling"]["active_stream_window"] == 2
    assert data["chunking"]["ramp"] == [1, 2]


def test_config_output_loads_back_to_the_same_settings(capsys, tmp_path):
    argv = ["--config", str(CONFIGS / "sim.yaml"), "--set", "server.log_level=debug"]
    printed = tmp_path / "printed.yaml"
    assert main(["config", *argv]) == 0
    printed.write_text(capsys.readouterr().out)
    expected = load_settings(CONFIGS / "sim.yaml", ["server.log_level=debug"], environ={})
    assert load_settings(printed, environ={}) == expected


def test_config_hides_the_api_key(capsys):
    data = printed_config(capsys, "--set", "server.api_key=hunter2")
    assert data["server"]["api_key"] == "***"


def test_bad_setting_exits_2_with_one_line(capsys):
    assert main(["config", "--set", "server.port=0"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("playhead: error: --set: server.port: ")
    assert err.count("\n") == 1


def test_no_command_exits_2(capsys):
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert main(["serve", "--help"]) == 0
    assert "--set" in capsys.readouterr().out


def child_environment() -> dict[str, str]:
    """This checkout first on the path (whatever the installed copy maps), no PLAYHEAD_ vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYHEAD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = child_environment()
    return subprocess.run(
        [sys.executable, "-m", "app", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--set", "scheduling.policy=rr"], "--set: scheduling.policy: "),
        (["--port", "70000"], "--port: server.port: "),
        (["--config", "missing.yaml"], "missing.yaml: no such file"),
    ],
)
def test_serve_with_a_bad_value_exits_2_without_traceback(tmp_path, argv, expected):
    result = run_cli("serve", *argv, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"playhead: error: {expected}")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_python_dash_m_app_config(tmp_path):
    result = run_cli("config", "--config", str(CONFIGS / "sim.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["backend"]["kind"] == "sim"


SERVE_WITH_A_STAND_IN_APP = """
import sys, types
from app.settings import Settings

def create_app(settings):
    assert isinstance(settings, Settings)
    body = f"{settings.server.host}:{settings.server.port} {settings.backend.kind}".encode()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app

module = types.ModuleType("app.server")
module.create_app = create_app
sys.modules["app.server"] = module  # app.server is another module's; serve only needs create_app
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_runs_uvicorn_with_the_settings_and_stops_on_sigint(tmp_path):
    port = free_port()
    env = child_environment()
    argv = ["serve", "--config", str(CONFIGS / "sim.yaml"), "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITH_A_STAND_IN_APP, *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        assert response.text == f"127.0.0.1:{port} sim"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    line = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO "
    assert re.search(rf"^{line}playhead\.cli: settings from .*sim\.yaml", err, re.M), err
    assert re.search(rf"^{line}uvicorn\.error: Uvicorn running on", err, re.M), err
    assert "Traceback" not in err


def test_a_wyoming_port_in_use_is_one_line_without_traceback(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "serve", "--port", "8598", "--wyoming-port", str(port), "--set", "backend.kind=sim",
            cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"playhead: error: cannot listen for Wyoming on 127.0.0.1:{port}: "
        f"{os.strerror(errno.EADDRINUSE)}\n"
    )


def test_wyoming_with_replicas_is_refused_at_start_up_saying_why(tmp_path):
    result = run_cli("serve", "--replicas", "2", "--wyoming-port", "8599", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"playhead: error: {WYOMING_WITH_REPLICAS}\n"
    assert "bypass that admission" in result.stderr


def test_a_jobs_dir_that_cannot_be_made_is_one_line_without_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = run_cli(
        "serve", "--port", "8597", "--set", "backend.kind=sim",
        "--set", f"jobs.dir={blocker / 'jobs'}", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(f"playhead: error: cannot keep jobs in {blocker / 'jobs'}: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
