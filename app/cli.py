"""The `playhead` command: `serve` runs the server, `config` prints the effective settings,
`say` speaks through a running server (app/say.py), `read` renders a long text file as a
job and downloads it (app/jobs/read.py).

The settings file is `--config`, else $PLAYHEAD_CONFIG, else the packaged
configs/default.yaml (the measured defaults, shipped inside the package), so an installed
`playhead serve` runs the same settings from any working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from app import __version__, say
from app.jobs import read as read_job
from app.logs import configure_logging
from app.settings import Settings, SettingsError, load_settings
from configs import packaged_config

CONFIG_ENV = "PLAYHEAD_CONFIG"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

log = logging.getLogger("playhead.cli")
# why --wyoming-port and --replicas are refused together, said at start-up
WYOMING_WITH_REPLICAS = (
    "--wyoming-port (wyoming.enabled) cannot be combined with --replicas (cluster.replicas): "
    "Ray Serve routes only HTTP to the replicas, each of which admits its own streams, so a "
    "Wyoming port would bypass that admission; serve Wyoming from a single server "
    "(cluster.replicas 0)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="playhead", description="Streaming text-to-speech server."
    )
    parser.add_argument("--version", action="version", version=f"playhead {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        help=f"YAML settings file (default: ${CONFIG_ENV}, else the packaged "
        "configs/default.yaml: the measured defaults)",
    )
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one setting (repeatable; the value is read as YAML)",
    )

    serve = commands.add_parser("serve", parents=[common], help="run the HTTP server")
    serve.add_argument("--host", help="listen address (server.host)")
    serve.add_argument("--port", type=int, help="listen port (server.port)")
    serve.add_argument(
        "--wyoming-port",
        type=int,
        metavar="N",
        help="also serve the Wyoming protocol (Home Assistant) on TCP port N "
        "(wyoming.port, turns wyoming.enabled on)",
    )
    serve.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="run N replicas on Ray Serve (cluster.replicas; needs the `cluster` extra)",
    )
    commands.add_parser("config", parents=[common], help="print the effective settings as YAML")
    say.add_parser(commands)
    read_job.add_parser(commands)
    return parser


def _config_path(explicit: str | None) -> Path | Traversable:
    if explicit:
        return Path(explicit)
    if from_env := os.environ.get(CONFIG_ENV):
        return Path(from_env)
    return packaged_config()


def _load(args: argparse.Namespace) -> tuple[Settings, Path | Traversable]:
    path = _config_path(args.config)
    options: list[tuple[str, str, Any]] = []
    if getattr(args, "host", None) is not None:
        options.append(("--host", "server.host", args.host))
    if getattr(args, "port", None) is not None:
        options.append(("--port", "server.port", args.port))
    if getattr(args, "wyoming_port", None) is not None:
        options.append(("--wyoming-port", "wyoming.port", args.wyoming_port))
        options.append(("--wyoming-port", "wyoming.enabled", True))
    if getattr(args, "replicas", None) is not None:
        options.append(("--replicas", "cluster.replicas", args.replicas))
    return load_settings(path, args.overrides, options=options), path


class _Dumper(yaml.SafeDumper):
    """Block mappings, flow lists: `ramp: [8, 16, 32]`, as in configs/."""


_Dumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, True)
)


def settings_yaml(settings: Settings) -> str:
    """The settings as a YAML document (a set api_key is shown as ***)."""
    data = settings.model_dump(mode="json")
    if data["server"]["api_key"] is not None:
        data["server"]["api_key"] = "***"
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def _serve(settings: Settings, path: Path | Traversable) -> int:
    server = settings.server
    configure_logging(server.log_level, LOG_FORMAT)
    if settings.cluster.replicas:
        if settings.wyoming.enabled:
            print(f"playhead: error: {WYOMING_WITH_REPLICAS}", file=sys.stderr)
            return 2
        return _serve_cluster(settings)
    try:
        from app.server import create_app
        from app.shutdown import GracefulServer
        from app.state import find_app_state
    except ImportError as exc:
        print(f"playhead: error: cannot import app.server: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    app = create_app(settings)
    state = find_app_state(app)
    try:
        for service in state.services if state is not None else ():
            service.bind()  # the Wyoming port: in use is this one line, before anything starts
    except OSError as exc:
        print(f"playhead: error: {exc.strerror}", file=sys.stderr)
        return 2
    log.info(
        "settings from %s; backend %s; policy %s K=%d",
        path,
        settings.backend.kind,
        settings.scheduling.policy,
        settings.scheduling.active_stream_window,
    )
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        log_config=None,  # uvicorn's loggers propagate to the root handler set up above
        # after the drain (app/shutdown.py) only idle connections are left to close
        timeout_graceful_shutdown=2,
    )
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn raises it again at exit
        GracefulServer(config, state).run()
    return 0


def _serve_cluster(settings: Settings) -> int:
    try:
        from app.cluster.launch import serve_forever
    except ImportError as exc:
        print(
            f"playhead: error: --replicas needs Ray Serve (pip install 'playhead[cluster]'): {exc}",
            file=sys.stderr,
        )
        return 2
    return serve_forever(settings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "say":  # a client: no server settings
        return say.run(args)
    if args.command == "read":  # a client too
        return read_job.run(args)
    try:
        settings, path = _load(args)
    except SettingsError as exc:
        print(f"playhead: error: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        sys.stdout.write(settings_yaml(settings))
        return 0
    return _serve(settings, path)


if __name__ == "__main__":
    raise SystemExit(main())
