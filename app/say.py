"""`playhead say "text"`: speak through a running server into a file or to standard output.

A client of POST /v1/audio/speech (httpx): the audio is written as it arrives, so a player
reading standard output (`playhead say "hi" -o - | aplay`) starts before the server has
finished. A file is written as `<name>.part` and renamed when the body is complete: a
request that fails midway leaves no truncated file behind. The format is the output's
extension (wav, mp3, opus or ogg, aac, flac, pcm) unless `--format` says; standard output
gets wav unless `--format` says.

Exit codes: 0 done; 1 the server refused the request (its message is printed) or the
stream broke; 2 a usage error; 3 no server at --server; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"
API_KEY_ENV = "PLAYHEAD_API_KEY"
SERVER_ENV = "PLAYHEAD_SERVER"
SPEECH_PATH = "/v1/audio/speech"
EXTENSION_FORMATS = {
    ".wav": "wav",
    ".mp3": "mp3",
    ".opus": "opus",
    ".ogg": "opus",
    ".aac": "aac",
    ".flac": "flac",
    ".pcm": "pcm",
    ".raw": "pcm",
}
FORMATS = ("wav", "mp3", "opus", "aac", "flac", "pcm")
STDOUT = "-"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # the longest silence between two pieces of the body

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NO_SERVER = 3
EXIT_INTERRUPTED = 130


class SayError(Exception):
    """A failure to report on one line, with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    say = commands.add_parser(
        "say",
        help="speak text through a running server into a file or to stdout",
        description="Speak TEXT through a running Playhead server. The audio is written "
        "as it arrives. Exit codes: 0 done, 1 the server refused or the stream broke, "
        "2 usage, 3 no server, 130 interrupted.",
    )
    say.add_argument("text", help='the text to speak ("-": read it from stdin)')
    say.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="the audio file, its format from the extension (.wav .mp3 .opus .ogg .aac "
        '.flac .pcm); "-": standard output (default when stdout is not a terminal)',
    )
    say.add_argument(
        "--format", choices=FORMATS, help="the response format (default: from the extension)"
    )
    say.add_argument("--voice", default="alloy", help="voice id (default: alloy)")
    say.add_argument("--speed", type=float, default=1.0, help="0.25 .. 4.0 (default: 1.0)")
    say.add_argument(
        "--sample-rate", type=int, metavar="HZ", help="output sample rate (default: the server's)"
    )
    say.add_argument("--model", default="tts-1", help="model id (default: tts-1)")
    say.add_argument(
        "--server",
        default=os.environ.get(SERVER_ENV, DEFAULT_SERVER),
        help=f"the server's base URL (default: ${SERVER_ENV}, else {DEFAULT_SERVER})",
    )
    say.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"the server's API key (default: ${API_KEY_ENV})",
    )
    say.add_argument(
        "-q", "--quiet", action="store_true", help="no summary line on stderr after a file"
    )


def _response_format(output: str, explicit: str | None) -> str:
    if explicit is not None:
        return explicit
    if output == STDOUT:
        return "wav"
    suffix = Path(output).suffix.lower()
    if suffix not in EXTENSION_FORMATS:
        known = " ".join(EXTENSION_FORMATS)
        raise SayError(
            f"cannot tell the format of {output!r} from its extension (one of: {known}); "
            "or give --format",
            EXIT_USAGE,
        )
    return EXTENSION_FORMATS[suffix]


def _server_message(response: httpx.Response) -> str:
    """The message of the server's error envelope (OpenAI's), else the body's start."""
    try:
        error = json.loads(response.read())["error"]
        return str(error["message"])
    except (ValueError, KeyError, TypeError):
        return response.text.strip()[:300] or response.reason_phrase


def _refusal(response: httpx.Response, server: str) -> SayError:
    message = f"the server refused the request (HTTP {response.status_code}): "
    message += _server_message(response)
    if response.status_code == 401:
        message += f" (give --api-key or set ${API_KEY_ENV})"
    elif response.status_code == 404:
        message += f" (is {server} a Playhead server?)"
    return SayError(message, EXIT_REFUSED)


@contextlib.contextmanager
def _sink(output: str) -> Iterator[IO[bytes]]:
    """Standard output, or `<output>.part` renamed to `output` when the body ended well."""
    if output == STDOUT:
        yield sys.stdout.buffer
        return
    path = Path(output)
    part = path.with_name(path.name + ".part")
    try:
        with part.open("wb") as file:
            yield file
        part.replace(path)
    except OSError as exc:
        raise SayError(f"cannot write {output}: {exc.strerror or exc}", EXIT_REFUSED) from exc
    finally:
        part.unlink(missing_ok=True)


def _request_body(args: argparse.Namespace, text: str, fmt: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": args.model,
        "input": text,
        "voice": args.voice,
        "response_format": fmt,
        "speed": args.speed,
    }
    if args.sample_rate is not None:
        body["sample_rate"] = args.sample_rate
    return body


def say(args: argparse.Namespace) -> int:
    """Run `playhead say`; raises SayError (one line, an exit code) on failure."""
    text = sys.stdin.read() if args.text == "-" else args.text
    output = args.output
    if output is None:
        if sys.stdout.isatty():
            raise SayError(
                "give -o FILE (e.g. -o hello.wav), or -o - to write the audio to stdout "
                "for a player (playhead say 'hi' -o - | aplay)",
                EXIT_USAGE,
            )
        output = STDOUT
    fmt = _response_format(output, args.format)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    server = args.server.rstrip("/")
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    start_s = time.monotonic()
    first_byte_s: float | None = None
    written = 0
    try:
        with (
            httpx.Client(base_url=server, headers=headers, timeout=timeout) as client,
            client.stream("POST", SPEECH_PATH, json=_request_body(args, text, fmt)) as response,
        ):
            if response.status_code != 200:
                raise _refusal(response, server)
            with _sink(output) as sink:
                for piece in response.iter_raw():
                    if first_byte_s is None:
                        first_byte_s = time.monotonic()
                    sink.write(piece)
                    sink.flush()  # a player on stdout gets every piece as it comes
                    written += len(piece)
    except httpx.ConnectError as exc:
        raise SayError(
            f"no Playhead server at {server} ({_reason(exc)}): start one with `make serve` "
            "(or `playhead serve`), or point --server at yours",
            EXIT_NO_SERVER,
        ) from exc
    except httpx.TimeoutException as exc:
        raise SayError(f"the server at {server} timed out: {_reason(exc)}", EXIT_REFUSED) from exc
    except httpx.HTTPError as exc:  # the body cut midway (the server's stream failed)
        raise SayError(
            f"the audio stream from {server} broke after {written} bytes: {_reason(exc)}"
            + ("" if output == STDOUT else f"; {output} was not written"),
            EXIT_REFUSED,
        ) from exc
    if output != STDOUT and not args.quiet:
        first_ms = (first_byte_s - start_s) * 1e3 if first_byte_s is not None else float("nan")
        print(
            f"playhead: wrote {output} ({fmt}, {written} bytes; first audio after "
            f"{first_ms:.0f} ms, done after {time.monotonic() - start_s:.2f} s)",
            file=sys.stderr,
        )
    return EXIT_OK


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def run(args: argparse.Namespace) -> int:
    """`playhead say` with its errors on one line of stderr and its exit code."""
    try:
        return say(args)
    except SayError as exc:
        print(f"playhead: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # the player stopped reading (e.g. `| head -c`): stop quietly; stdout is dead,
        # so the interpreter must not flush it again at exit
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("playhead: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
