"""Every attempt of one closed-loop point, rejected and unmeasured ones included.

The admission runs record only the measured requests; a listener refused during the
warm-up with a long Retry-After sleeps out of the window unseen. This prints each attempt:
when it was sent, its outcome, Retry-After, last byte, first audio, audio and playback end.
Found the 36 s Retry-After that emptied the Kokoro-alone points (2026-12-05 records).

    python -m benchmarks.lab.closed_loop_attempts [--config configs/kokoro.yaml]
        [--corpus benchmarks/corpus-ja.txt] [--streams 6] [--duration 20] [--warmup 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench import ROOT, serve
from benchmarks.listening import RequestResult, Tracker
from benchmarks.loadgen import Clock, RequestOptions, closed_loop, load_corpus, request_once
from benchmarks.voice import _voice_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lab.closed_loop_attempts")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "kokoro.yaml")
    parser.add_argument("--corpus", type=Path, default=ROOT / "benchmarks" / "corpus-ja.txt")
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--max-text-chars", type=int, default=150)
    parser.add_argument("--log", type=Path, default=Path("closed-loop-attempts.log"))
    args = parser.parse_args(argv)
    texts = tuple(t for t in load_corpus(args.corpus) if len(t) <= args.max_text_chars)
    attempts: list[dict[str, Any]] = []

    async def request(
        client: httpx.AsyncClient,
        url: str,
        text: str,
        options: RequestOptions,
        clock: Clock,
        waited_s: float = 0.0,
        tracker: Tracker | None = None,
    ) -> RequestResult:
        result = await request_once(client, url, text, options, clock, waited_s, tracker)
        r = result.record
        attempts.append(
            {
                "sent_s": round(r.sent_at_s, 2),
                "chars": len(text),
                "outcome": r.outcome.name,
                "status": r.http_status,
                "retry_after_s": r.retry_after_s,
                "last_byte_s": round(r.finished_at_s, 2),
                "ttfa_s": None if r.ttfa_s is None else round(r.ttfa_s, 2),
                "audio_s": round(r.playback.audio_s, 2),
                "played_to_s": r.playback.ended_at_s and round(r.playback.ended_at_s, 2),
            }
        )
        return result

    with serve(args.config, ["server.log_level=warning"], args.log) as url:
        options = asyncio.run(_voice_options(url))
        result = asyncio.run(
            closed_loop(
                url,
                texts,
                streams=args.streams,
                duration_s=args.warmup + args.duration,
                warmup_s=args.warmup,
                options=options,
                request=request,
            )
        )
    start, end = result.window_s
    print(json.dumps({"window_s": [round(start, 2), round(end, 2)], "attempts": attempts}))
    print(
        f"window {end - start:.1f} s of {args.duration:g}, {result.summary.streams_ok} measured "
        f"streams, {len(attempts)} attempts",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
