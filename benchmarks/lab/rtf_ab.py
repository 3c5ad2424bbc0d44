"""Single-request RTF and TTFA, A/B, interleaved request by request, beside piper's server.

    python -m benchmarks.lab.rtf_ab [--rounds 4] [--a alone.work_ahead=false]
                                [--b alone.work_ahead=true] [--no-peer] [--a-tree DIR]
                                [--texts first|short|long] [--settle 0.2]

Two Playhead servers (configs/default.yaml plus the --a and --b settings; idle
recalibration off, so that neither calibrates while the other is measured) and
`python -m piper.http_server` run side by side, idle but for the one request in flight.
Each round sends every text of benchmarks/voice.py's single-stream sets to each server in
turn (the order rotates text by text and round by round), one request at a time, read
as fast as possible, `--settle` s of quiet after each (benchmarks.voice.SETTLE_S): RTF
= (last byte - request sent) / audio, TTFA = first audio - request sent (the client's
clock, as benchmarks/voice.py). Prints p50 per server and the per-text paired ratio B/A.
`--texts`: `first` (default) voice.py's sets (a short first sentence, a long one);
`short` whole texts of 1-3 s of audio, `long` single sentences of 9.4-10.1 s (a lone request:
issue #55). With the peer, each of A and B also gets its ratio to piper's server per
text (the median over rounds), and the median of those over the texts.

`--load 8,12`: then, for each N, closed loops of N listeners (each sends its next
request when it has heard the last, as benchmarks/voice.py's N sweep) against A, B, B, A
(`--load-duration` s each after a 2 s warm-up), and one saturated loop of the largest N
(next request at the last byte: throughput, as C) against A, B, B, A.

`--a-tree DIR`: server A runs the code of another checkout (say `git worktree add
/tmp/old <commit>`): old against new, interleaved in the same minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench import LoadPlan, number_list, run_load, serve
from benchmarks.loadgen import Clock, load_corpus, request_once
from benchmarks.voice import CONFIG, LONG_FIRST, SETTLE_S, SHORT_FIRST, _voice_options
from benchmarks.voice_peer import piper_server
from pipeline.backends.piper import bundled_model_path

BASE = ("server.log_level=warning", "engine.recalibrate_idle_s=0")
TEXTS = (*SHORT_FIRST, *LONG_FIRST)
# whole texts of 1-3 s of audio on the default voice (1.3-2.2 s; LONG_FIRST: 9.4-10.1 s)
SHORT_TEXTS = (
    "Hello there, how are you today?",
    "Your coffee is ready.",
    "Thank you, your order has been placed.",
    "The meeting starts at noon.",
    "Please turn off the lights in the hall.",
    "I will call you back in ten minutes.",
)
TEXT_SETS = {"first": TEXTS, "short": SHORT_TEXTS, "long": LONG_FIRST}


def _p50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def rotation(names: Sequence[str], round_index: int, text_index: int) -> list[str]:
    """The servers' order for one text of one round: over len(names) rounds every text
    takes every place (a rotation by text alone repeats round after round when the number
    of texts is a multiple of the number of servers)."""
    turn = (round_index + text_index) % len(names)
    return [*names[turn:], *names[:turn]]


async def _measure(
    urls: dict[str, str],
    rounds: int,
    peer: str | None,
    settle_s: float = SETTLE_S,
    texts: Sequence[str] = TEXTS,
) -> dict[str, Any]:
    options = {name: await _voice_options(url) for name, url in urls.items() if name != peer}
    samples: dict[str, dict[str, list[float]]] = {n: {"rtf": [], "ttfa": []} for n in urls}
    paired: list[float] = []  # b / a per text and round
    to_peer: dict[str, list[list[float]]] = {n: [[] for _ in texts] for n in urls if n != peer}
    names = list(urls)
    async with httpx.AsyncClient(timeout=120.0) as client:
        for name, url in urls.items():  # warm each once
            await _one(client, name, url, texts[0], options, peer)
        for round_index in range(rounds):
            for text_index, text in enumerate(texts):
                rtfs: dict[str, float] = {}
                for name in rotation(names, round_index, text_index):
                    rtf, ttfa = await _one(client, name, urls[name], text, options, peer)
                    await asyncio.sleep(settle_s)
                    if rtf is not None:
                        samples[name]["rtf"].append(rtf)
                        rtfs[name] = rtf
                    if ttfa is not None:
                        samples[name]["ttfa"].append(ttfa)
                if "a" in rtfs and "b" in rtfs:
                    paired.append(rtfs["b"] / rtfs["a"])
                if peer in rtfs:
                    for name in to_peer:
                        if name in rtfs:
                            to_peer[name][text_index].append(rtfs[name] / rtfs[peer])
    per_text = {n: [_p50(r) for r in ratios] for n, ratios in to_peer.items()}
    return {
        "servers": {
            name: {
                "requests": len(s["rtf"]),
                "rtf_p50": _p50(s["rtf"]),
                "ttfa_p50_ms": None if not s["ttfa"] else 1000 * statistics.median(s["ttfa"]),
            }
            for name, s in samples.items()
        },
        "paired_b_over_a_p50": _p50(paired),
        # RTF over the peer's, per text (median over rounds), and the median over texts
        "to_peer_per_text": per_text if peer else {},
        "to_peer_p50": (
            {n: _p50([r for r in rs if r is not None]) for n, rs in per_text.items()}
            if peer
            else {}
        ),
        "samples": samples,
    }


async def _one(
    client: httpx.AsyncClient,
    name: str,
    url: str,
    text: str,
    options: dict[str, Any],
    peer: str | None,
) -> tuple[float | None, float | None]:
    if name == peer:
        from benchmarks.voice_peer import PEER_OPTIONS, peer_request

        result = await peer_request(client, url, text, PEER_OPTIONS, Clock())
    else:
        result = await request_once(client, url, text, options[name], Clock())
    record = result.record
    if record.rtf is None:
        print(f"{name}: no audio ({record.outcome}, {record.http_status}, {record.error})")
    return record.rtf, record.ttfa_s


_HZ = os.sysconf("SC_CLK_TCK")


def _busy_s() -> float:
    """CPU seconds every process on the host has used (/proc/stat)."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / _HZ


def _children_cpu_s() -> float:
    """CPU seconds of this process and its children (the servers), from /proc."""
    me, total = os.getpid(), 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == me or int(fields[1]) == me:  # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / _HZ
    return total


def _load(urls: dict[str, str], counts: Sequence[int], duration_s: float) -> dict[str, Any]:
    options = asyncio.run(_voice_options(urls["a"]))
    plan = LoadPlan(
        texts=tuple(t for t in load_corpus() if len(t) <= 400),
        options=options,
        duration_s=duration_s,
        capacity_duration_s=duration_s,
    )
    out: dict[str, Any] = {}
    points = [(n, False) for n in counts] + [(max(counts), True)]
    for n, saturated in points:
        key = f"{'saturated' if saturated else 'listeners'}-{n}"
        out[key] = {"a": [], "b": []}
        for name in ("a", "b", "b", "a"):
            busy0, ours0, started = _busy_s(), _children_cpu_s(), time.perf_counter()
            result = run_load(urls[name], n, plan, capacity=saturated)
            wall_s = time.perf_counter() - started
            ours_s = _children_cpu_s() - ours0
            foreign = max(0.0, _busy_s() - busy0 - ours_s) / wall_s
            summary = result.summary.as_dict()
            figures = {
                "xrt": summary["xrt"],
                "throughput": result.burst_throughput() if saturated else None,
                "stall_ratio": summary["stall_ratio"],
                "stall_free": sum(1 for r in result.records if r.playback.stall_free()),
                "streams_ok": summary["streams_ok"],
                "ttfa_p50_ms": summary["ttfa_p50_ms"],
                "ttfa_p99_ms": summary.get("ttfa_p99_ms"),
                "rejected": summary["rejected"],
                "foreign_cores": round(foreign, 3),  # other processes' CPU meanwhile
            }
            out[key][name].append(figures)
            print(key, name, json.dumps(figures), file=sys.stderr, flush=True)
            time.sleep(1.0)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lab.rtf_ab", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--a", action="append", default=[], help="A's --set (repeatable)")
    parser.add_argument("--b", action="append", default=[], help="B's --set (repeatable)")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument(
        "--a-tree", default=None, help="A runs this checkout's code (old against new)"
    )
    parser.add_argument(
        "--settle", type=float, default=SETTLE_S, help="quiet after each request, seconds"
    )
    parser.add_argument("--texts", choices=sorted(TEXT_SETS), default="first")
    parser.add_argument("--logs", default="/tmp/rtf_ab")
    parser.add_argument("--json", default=None, help="write the result here too")
    parser.add_argument("--load", default="", help="N of the listener loops, e.g. 8,12")
    parser.add_argument("--load-duration", type=float, default=10.0)
    args = parser.parse_args(argv)
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    a_tree = None if args.a_tree is None else Path(args.a_tree).resolve()
    with contextlib.ExitStack() as stack:
        urls = {
            "a": stack.enter_context(serve(CONFIG, [*BASE, *args.a], logs / "a.log", tree=a_tree)),
            "b": stack.enter_context(serve(CONFIG, [*BASE, *args.b], logs / "b.log")),
        }
        peer = None
        if not args.no_peer:
            peer = "piper-http"
            urls[peer] = stack.enter_context(piper_server(bundled_model_path(), logs / "p.log"))
        texts = TEXT_SETS[args.texts]
        measure = _measure(urls, args.rounds, peer, args.settle, texts)
        result = asyncio.run(measure) if args.rounds else {}
        if args.load:
            result["load"] = _load(urls, number_list(args.load, int), args.load_duration)
    result["a"], result["b"], result["texts"] = args.a, args.b, args.texts
    if a_tree is not None:
        result["a_tree"] = str(a_tree)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
