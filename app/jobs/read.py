"""`playhead read FILE -o book.mp3`: a long text rendered as a job by a running server.

It submits FILE (.txt, or .md with its headings as chapters) to /v1/audio/jobs, then
downloads the audio while it renders, with a progress bar and the server's predicted
finish on stderr. The job's id is kept beside the output (`book.mp3.job`) until the
download is whole: run the same command again after an interruption (Ctrl-C, a network
error, the server restarted) and it goes on from the last byte it wrote, the job resuming
on the server at its last whole segment. Exit codes: 0 done, 1 the server refused or the
job failed, 2 usage, 3 no server, 130 interrupted (run it again to resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

from app.say import (
    API_KEY_ENV,
    DEFAULT_SERVER,
    EXIT_INTERRUPTED,
    EXIT_NO_SERVER,
    EXIT_REFUSED,
    EXIT_USAGE,
    EXTENSION_FORMATS,
    SERVER_ENV,
    SayError,
    _server_message,
)

POLL_S = 1.0
BAR_WIDTH = 30


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    read = commands.add_parser(
        "read",
        help="render a long text file as a job and download its audio as it renders",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    read.add_argument("file", help="the text: a .txt or .md file (UTF-8)")
    read.add_argument("-o", "--output", required=True, metavar="PATH", help="the audio file")
    read.add_argument("--voice", default="alloy", help="voice id (default: alloy)")
    read.add_argument("--speed", type=float, default=1.0, help="0.25 .. 4.0 (default: 1.0)")
    read.add_argument("--title", help="the job's title (default: the file's name)")
    read.add_argument(
        "--finish-by", metavar="TIME", help="ISO 8601 time the job must finish by (a deadline)"
    )
    read.add_argument(
        "--server",
        default=os.environ.get(SERVER_ENV, DEFAULT_SERVER),
        help=f"the server's base URL (default: ${SERVER_ENV}, else {DEFAULT_SERVER})",
    )
    read.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"the server's API key (default: ${API_KEY_ENV})",
    )
    read.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _format(output: Path) -> str:
    suffix = output.suffix.lower()
    if suffix not in EXTENSION_FORMATS:
        known = " ".join(EXTENSION_FORMATS)
        raise SayError(f"cannot tell the format of {str(output)!r} (one of: {known})", EXIT_USAGE)
    return EXTENSION_FORMATS[suffix]


def _state_path(output: Path) -> Path:
    return output.with_name(output.name + ".job")


def _submit(client: httpx.Client, args: argparse.Namespace, output: Path) -> str:
    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SayError(f"cannot read {args.file!r}: {exc.strerror}", EXIT_USAGE) from None
    markdown = path.suffix.lower() in (".md", ".markdown")
    params = {
        "voice": args.voice,
        "speed": str(args.speed),
        "response_format": _format(output),
        "title": args.title or path.stem,
    }
    if args.finish_by:
        params["finish_by"] = args.finish_by
    response = client.post(
        "/v1/audio/jobs",
        params=params,
        content=data,
        headers={"Content-Type": "text/markdown" if markdown else "text/plain"},
    )
    if response.status_code != 202:
        raise SayError(
            f"the server refused the job (HTTP {response.status_code}): "
            + _server_message(response),
            EXIT_REFUSED,
        )
    return str(response.json()["id"])


class _Progress:
    """The job's state, polled on a thread, drawn as one line on stderr."""

    def __init__(self, client: httpx.Client, job_id: str, quiet: bool) -> None:
        self.client, self.job_id, self.quiet = client, job_id, quiet
        self.job: dict[str, object] = {}
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if not self.quiet:
            self.draw()
            sys.stderr.write("\n")

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                response = self.client.get(f"/v1/audio/jobs/{self.job_id}")
                if response.status_code == 200:
                    self.job = response.json()
            except httpx.HTTPError:
                pass
            if not self.quiet:
                self.draw()

    def draw(self) -> None:
        progress = self.job.get("progress") or {}
        assert isinstance(progress, dict)
        chars, done = progress.get("characters") or 0, progress.get("characters_done") or 0
        share = done / chars if chars else 0.0
        filled = int(share * BAR_WIDTH)
        eta = ""
        predicted = self.job.get("predicted_finish_at")
        if self.job.get("state") == "done":
            eta = "done"
        elif isinstance(predicted, str):
            left_s = datetime.fromisoformat(predicted.replace("Z", "+00:00")).timestamp()
            eta = f"ETA {max(0, int(left_s - time.time()))} s"
        audio_s = progress.get("audio_seconds") or 0.0
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share:4.0%} "
            f"{audio_s:7.1f} s of audio, {self.written / 1e6:6.2f} MB written {eta:<12}"
        )
        sys.stderr.flush()


def read(args: argparse.Namespace) -> int:
    output = Path(args.output)
    _format(output)
    state_path = _state_path(output)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.server, headers=headers, timeout=30) as client:
        try:
            job_id = None
            if state_path.exists() and output.exists():
                job_id = json.loads(state_path.read_text())["id"]
                if client.get(f"/v1/audio/jobs/{job_id}").status_code != 200:
                    job_id = None  # gone (deleted, expired): start over
            if job_id is None:
                job_id = _submit(client, args, output)
                output.write_bytes(b"")
                state_path.write_text(json.dumps({"id": job_id, "server": args.server}))
            _download(client, job_id, output, args.quiet)
        except httpx.ConnectError as exc:
            raise SayError(f"no server at {args.server}: {exc}", EXIT_NO_SERVER) from None
    state_path.unlink()
    return 0


def _download(client: httpx.Client, job_id: str, output: Path, quiet: bool) -> None:
    offset = output.stat().st_size
    url = f"/v1/audio/jobs/{job_id}/audio"
    with (
        _Progress(client, job_id, quiet) as progress,
        open(output, "ab") as file,
        client.stream("GET", url, params={"offset_bytes": offset}, timeout=None) as response,
    ):
        if response.status_code != 200:
            response.read()
            raise SayError(
                f"the job's audio is not available (HTTP {response.status_code}): "
                + _server_message(response),
                EXIT_REFUSED,
            )
        progress.written = offset
        for part in response.iter_bytes():
            file.write(part)
            progress.written += len(part)
        file.flush()
        job = client.get(f"/v1/audio/jobs/{job_id}").json()
        progress.job = job
    if job.get("state") != "done":
        raise SayError(f"the job ended {job.get('state')}: {job.get('error')}", EXIT_REFUSED)


def run(args: argparse.Namespace) -> int:
    try:
        return read(args)
    except SayError as exc:
        print(f"playhead: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (httpx.HTTPError, KeyboardInterrupt) as exc:
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"broke off: {exc}"
        print(
            f"\nplayhead: the download {reason}; run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
