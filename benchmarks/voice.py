"""`make bench-voice`: Playhead on the real voice (Piper en_US-joe-medium), beside piper's
own HTTP server, in one run on this machine.

    python -m benchmarks.voice [--quick] [--set section.field=value ...]

1. Single stream, Playhead as deployed (`python -m app serve --config
   configs/default.yaml`, i.e. `playhead serve`: edf K=1 + admission) and `python -m
   piper.http_server -m <bundled voice>` (whole requests, a WAV once synthesis ends; TTFA
   = first byte of the WAV; benchmarks/voice_peer.py) running side by side: TTFA and RTF
   for texts whose first sentence is short ("Hello there. ...") and for texts whose first
   sentence has 30+ words, each text sent to one server and then the other (the order
   swapping text by text), one request at a time, read as fast as possible, so that the
   host's drift falls on both alike. Playhead's pcm at the voice's own rate.
2. Closed loops of 1, 4, 8 and 16 listeners, each sending its next request once it has
   heard the last one (xRT, stall ratio, stall-free share, TTFA, RTF, 429s), against each
   server alone.
3. Capacity C of Playhead on this voice: the audio per second a closed loop of clients
   that never wait (next request at the last byte) gets, the larger of fifo with no window
   and edf K=1, both without admission. Then the policy comparison of benchmarks/bench.py
   (fifo K=0, fifo K, edf K, edf K + admission with K=1, the CPU setting; plus edf K=4 for
   contrast) at N = 10 and 0.9, 1 and 1.5 x C (the target at 0.9 C: every stream of edf
   K=1 stall-free, TTFA p99 under 300 ms). Right after C, the machine's limit
   (benchmarks/voice_limit.py: piper's whole model in one single-thread process per core,
   and in one process with a thread per core; the better counts) on the same texts, and
   C / limit. C and the limit are measured in `--capacity-rounds` rounds (2; C, then the
   limit), each figure the mean of its rounds: the host's speed drifts within minutes.
4. benchmarks/results/voice-<timestamp>/: results.json, table.md, plots, server logs;
   copied to benchmarks/results/voice-latest.json and benchmarks/results/voice-latest/.

Every figure comes from the client side (benchmarks/player.py): the server is never asked
how it did. RTF = (last byte - request sent) / audio duration: lower is faster.
results.json: {"machine", "date", "backend", "voice", "capacity_audio_s_per_s",
"machine_limit" ({"audio_s_per_s", "layout", "by_layout", "runs", "rounds",
"capacity_ratio"} or null; each round: C per policy, the limit per layout, its own ratio),
"single_stream": {server: {"short"|"long": row}}, "concurrency": {server: [row]},
"runs": [policy rows as in benchmarks/bench.py], "targets", ...}; a row is a
benchmarks.player.Summary (as_dict) plus streams, stall_free_streams, ttfa_ms, errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench import (
    LoadPlan,
    Policy,
    add_common_arguments,
    config_name,
    machine,
    measure_capacity,
    new_run_dir,
    number_list,
    policies,
    run_load,
    run_row,
    serve,
    sweep,
)
from benchmarks.loadgen import Clock, LoadResult, RequestOptions, load_corpus
from benchmarks.player import Outcome, StreamRecord, summarize
from benchmarks.report import publish_latest
from benchmarks.seams import TARGET_DB as SEAM_TARGET_DB
from benchmarks.seams import default_sweep
from benchmarks.voice_limit import LimitRun, measure_limit
from benchmarks.voice_peer import PEER_DRAIN_TIMEOUT_S, PEER_OPTIONS, peer_request, piper_server
from benchmarks.voice_report import write_voice_report
from benchmarks.voice_targets import PIPER, PLAYHEAD, TARGET_STALL_FREE_STREAMS, WINDOW, targets
from pipeline.backends.piper import bundled_model_path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "default.yaml"
SERVER_SETTINGS = ("server.log_level=warning",)

# Single-stream texts: a short first sentence, then more.
SHORT_FIRST = (
    "Hello there. This is a quick test of how soon the first words arrive.",
    "Good morning. Your coffee is ready and the paper is on the kitchen table.",
    "Thank you. Your order has been placed and it should arrive on Tuesday.",
    "Hi again. The meeting room on the second floor is free after lunch.",
    "Sure thing. I have set a timer for twenty minutes, starting now.",
)
# A first sentence of 30+ words (Playhead cuts its first fragment; piper cannot).
LONG_FIRST = (
    "When the old lighthouse keeper finally climbed the narrow spiral stairs for the last "
    "time, he paused at every window to look out over the grey water that he had watched "
    "for more than forty years.",
    "Before you leave the house this morning, please remember to switch off the oven, close "
    "the windows in the back bedroom, feed the cat, water the plants and lock the side gate "
    "behind you.",
    "The committee that met yesterday afternoon in the small room above the library agreed "
    "after a long and sometimes heated discussion that the summer festival should move to "
    "the park by the river.",
    "Although the forecast promised clear skies for the whole weekend, a band of heavy rain "
    "swept in from the west on Saturday morning and forced the organisers to move every "
    "event into the town hall.",
)
STREAM_COUNTS = (1, 4, 8, 16)
FACTORS = (0.9, 1.0, 1.5)  # policy comparison: N = these x C, and TARGET_STALL_FREE_STREAMS
EXTRA_WINDOWS = (4,)


def _log(message: str) -> None:
    print(f"[bench-voice {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def row(server: str, result: LoadResult) -> dict[str, Any]:
    """One measured load: the player summary plus the samples and counts."""
    ok = [r for r in result.records if r.outcome is Outcome.OK]
    return {
        "server": server,
        "streams": int(result.load),
        **result.summary.as_dict(),
        "stall_free_streams": sum(1 for r in ok if r.playback.stall_free()),
        "audio_s_mean": (result.summary.audio_s / len(ok)) if ok else None,
        "errors": sorted({r.error for r in result.records if r.error})[:5],
        "ttfa_ms": [round(t * 1000.0, 2) for t in result.ttfas_s()],
    }


def _short(r: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        return "-" if r.get(key) is None else f"{r[key]:.0f}"

    return (
        f"xRT {r['xrt']:.2f} stall ratio {r['stall_ratio']:.3f} stall-free "
        f"{r['stall_free_streams']}/{r['streams_ok']} TTFA p50/p95 {ms('ttfa_p50_ms')}/"
        f"{ms('ttfa_p95_ms')} ms RTF p50 {r['rtf_p50'] or 0:.3f} rejected {r['rejected']}"
    )


async def _voice_options(url: str) -> RequestOptions:
    """pcm in the served voice at its own rate."""
    async with httpx.AsyncClient(timeout=10.0) as client:
        voice = (await client.get(url + "/v1/audio/voices")).json()["voices"][0]
    return RequestOptions(
        voice=voice["id"], response_format="pcm", sample_rate_hz=int(voice["sample_rate"])
    )


async def _warm(url: str, plan: LoadPlan) -> None:
    async with httpx.AsyncClient(timeout=60.0) as client:
        for text in SHORT_FIRST[:2]:
            await plan.request(client, url, text, plan.options, Clock(), 0.0, None)


# Pause after each single-stream request, so the next one (either server's) starts on an
# idle machine. piper's server goes on using 20-30 ms of CPU in the 50 ms after each of
# its responses (its ONNX Runtime threads spin; Playhead's single-threaded sessions do
# not). Sent at once, two identical Playhead servers differed by 1.7-3.4% in RTF on short
# texts by how often each came right after piper (benchmarks.lab.rtf_ab, 12 rounds); with
# this pause, by 0.1%.
SETTLE_S = 0.1


async def alternating(
    targets: Sequence[tuple[str, str, LoadPlan]],
    texts: Sequence[str],
    count: int,
    seed: int,
    settle_s: float = SETTLE_S,
) -> dict[str, LoadResult]:
    """`count` texts drawn from `texts`, each sent to every target in turn, one request at
    a time, read as fast as possible (each target's own client: `LoadPlan.request`), with
    `settle_s` of quiet after each; the order swaps text by text, so that neither server
    is always measured first. One LoadResult per target: its requests, its wall time
    their sum."""
    rng = random.Random(f"{seed}:alternating")
    records: dict[str, list[StreamRecord]] = {name: [] for name, _, _ in targets}
    timeout = max(plan.options.timeout_s for _, _, plan in targets)
    async with httpx.AsyncClient(timeout=timeout) as client:
        for index in range(count):
            text = rng.choice(texts)
            for name, url, plan in targets if index % 2 == 0 else targets[::-1]:
                result = await plan.request(client, url, text, plan.options, Clock(), 0.0, None)
                records[name].append(result.record)
                await asyncio.sleep(settle_s)
    results: dict[str, LoadResult] = {}
    for name, _, plan in targets:
        measured = tuple(records[name])
        wall_s = sum(r.finished_at_s - r.sent_at_s for r in measured)
        summary = summarize(measured, wall_s=max(wall_s, 1e-9))
        results[name] = LoadResult("closed", 1.0, measured, summary, (0.0, wall_s), 0, plan.options)
    return results


class Bench:
    """The run's steps; each starts its own server(s) and stops them."""

    def __init__(self, args: argparse.Namespace, out_dir: Path) -> None:
        self.args = args
        self.out_dir = out_dir
        self.settings = [*SERVER_SETTINGS, *args.overrides]
        self.plan = LoadPlan(  # Playhead's; its options become the served voice and rate
            texts=tuple(t for t in load_corpus() if len(t) <= args.max_text_chars),
            options=RequestOptions(),
            duration_s=args.duration,
            warmup_s=args.warmup,
            capacity_duration_s=args.capacity_duration,
            seed=args.seed,
        )

    def single_streams(self) -> dict[str, dict[str, Any]]:
        """Single stream against each server, both running at once and idle but for the
        one request in flight: every text goes to each server in turn, the order swapping
        text by text (`alternating`). Measured one server after the other, a minute
        apart, the host's drift moved one server's RTF against the other's by 10%."""
        a = self.args
        peer_plan = self._peer_plan()
        with contextlib.ExitStack() as stack:
            targets = []
            if not a.no_peer:  # started first: its model loads before Playhead calibrates
                peer_log = self.out_dir / "server-piper-http.log"
                peer_url = stack.enter_context(piper_server(bundled_model_path(), peer_log))
                targets.append((PIPER, peer_url, peer_plan))
            log_path = self.out_dir / "server-playhead-single.log"
            url = stack.enter_context(serve(a.config, self.settings, log_path))
            self.plan = replace(self.plan, options=asyncio.run(_voice_options(url)))
            targets.insert(0, (PLAYHEAD, url, self.plan))
            for _, target_url, plan in targets:
                asyncio.run(_warm(target_url, plan))
            single: dict[str, dict[str, Any]] = {name: {} for name, _, _ in targets}
            for kind, texts in (("short", SHORT_FIRST), ("long", LONG_FIRST)):
                results = asyncio.run(alternating(targets, texts, a.requests, self.plan.seed))
                for name, result in results.items():
                    single[name][kind] = row(name, result)
                    _log(
                        f"{name} single stream, {kind} first sentence: {_short(single[name][kind])}"
                    )
        return single

    def _sweep(self, server: str, url: str, plan: LoadPlan) -> list[dict[str, Any]]:
        """Against one server: the closed loops of the N sweep."""
        asyncio.run(_warm(url, plan))
        by_n: list[dict[str, Any]] = []
        for n in self.args.counts:
            by_n.append(row(server, run_load(url, n, plan)))
            _log(f"{server} N={n:2d}: {_short(by_n[-1])}")
            time.sleep(1.0)  # let the server end (or finish) the cancelled background streams
        return by_n

    def playhead(self) -> list[dict[str, Any]]:
        with serve(self.args.config, self.settings, self.out_dir / "server-playhead.log") as url:
            self.plan = replace(self.plan, options=asyncio.run(_voice_options(url)))
            return self._sweep(PLAYHEAD, url, self.plan)

    def _peer_plan(self) -> LoadPlan:
        return replace(
            self.plan,
            options=PEER_OPTIONS,
            request=peer_request,
            drain_timeout_s=PEER_DRAIN_TIMEOUT_S,
        )

    def piper(self) -> list[dict[str, Any]]:
        log_path = self.out_dir / "server-piper-http-sweep.log"
        with piper_server(bundled_model_path(), log_path) as url:
            return self._sweep(PIPER, url, self._peer_plan())

    def capacity(self, round_index: int = 0) -> dict[str, tuple[float, LoadResult, Policy]]:
        """Audio per second received by clients that send their next request at the last
        byte (as benchmarks/bench.py), from fifo without a window and from edf with the
        served window, both without admission (C is the larger: `capacity_and_limit`).
        fifo without a window batches every ready stream into one turn, the most a
        batching backend can do; on a CPU, whose vocoder workers decode one chunk after
        another, one worker then takes every ready stream and the other waits for more,
        so the served schedule (edf) delivers more there."""
        measured: dict[str, tuple[float, LoadResult, Policy]] = {}
        for policy in (Policy("fifo", 0, False), Policy("edf", self.args.window, False)):
            log_path = self.out_dir / f"server-capacity-{policy.slug}-{round_index}.log"
            capacity, result = measure_capacity(
                self.args.config, self.settings, self.args.capacity_streams, self.plan,
                log_path, policy,
            )  # fmt: skip
            measured[policy.label] = (capacity, result, policy)
            _log(f"capacity under {policy.label}: {capacity:.2f} audio s per s")
        return measured

    def policies(self, capacity: float) -> list[dict[str, Any]]:
        a = self.args
        counts = sorted({max(1, round(f * capacity)) for f in a.factors} | set(a.policy_counts))
        plan = replace(self.plan, duration_s=a.policy_duration)
        runs: list[dict[str, Any]] = []
        extra = [Policy("edf", k, False) for k in a.extra_windows if k != a.window]
        for policy in [*policies(a.window), *extra]:
            log_path = self.out_dir / f"server-{policy.slug}.log"
            runs += sweep(a.config, self.settings, policy, counts, plan, capacity, log_path, _log)
        return runs


def seam_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The seam sweep (benchmarks/seams.py) at the served settings: every seam of 200+
    sentences against whole-segment synthesis (--quick: the first 40 sentences)."""
    sweep = default_sweep(args.config, [*SERVER_SETTINGS, *args.overrides], limit=40 * args.quick)
    _log(f"seam sweep: {sweep.line()}")
    return {
        **asdict(sweep),
        "vocoder_cost": sweep.vocoder_cost,
        "target_db": SEAM_TARGET_DB,
        "met": bool(sweep.worst_db >= SEAM_TARGET_DB),
    }


def machine_limit(args: argparse.Namespace, texts: Sequence[str]) -> list[LimitRun]:
    """The machine's limit on this voice (benchmarks/voice_limit.py): piper's whole model in
    one single-thread process per core, and in one process with a thread per core, audio
    seconds per wall second over the load's own texts; every layout's run."""
    _, runs = measure_limit(texts, seconds=args.limit_seconds)
    for run in runs:
        _log(f"limit layout {run.layout} (processes x threads): {_limit_line(run)}")
    return runs


def capacity_and_limit(
    bench: Bench, args: argparse.Namespace
) -> tuple[float, dict[str, Any] | None, dict[str, float], dict[str, Any] | None]:
    """C and the machine's limit, measured in `args.capacity_rounds` rounds (C under both
    policies, then the limit right after, on the same texts): the host's speed drifts by
    10-20% within minutes, and C and the limit measured once each, a minute apart, gave
    C / limit anywhere from 0.74 to 1.03 for the same code. Each policy's C and each
    layout's limit is the mean over the rounds; C is the larger policy's, the limit the
    best layout's. Returns (C, the chosen policy's last saturated run as a row, C per
    policy, the limit with C / limit and every round, or None with --no-limit)."""
    rounds: list[dict[str, Any]] = []
    limit_runs: list[dict[str, Any]] = []  # every layout's run of every round
    results: dict[str, tuple[LoadResult, Policy]] = {}
    for index in range(args.capacity_rounds):
        measured = bench.capacity(index)
        results.update({label: (result, policy) for label, (_, result, policy) in measured.items()})
        entry: dict[str, Any] = {"capacity_by_policy": {k: m[0] for k, m in measured.items()}}
        if not args.no_limit:
            runs = machine_limit(args, bench.plan.texts)
            entry["limit_by_layout"] = {r.layout: r.audio_s_per_s for r in runs}
            limit_runs += [r.as_dict() for r in runs]
        rounds.append(entry)
    by_policy = _mean_by_key([r["capacity_by_policy"] for r in rounds])
    label = max(by_policy, key=lambda k: by_policy[k])
    capacity = by_policy[label]
    result, policy = results[label]
    capacity_run = run_row(policy, result, capacity)
    if args.no_limit:
        return capacity, capacity_run, by_policy, None
    by_layout = _mean_by_key([r["limit_by_layout"] for r in rounds])
    layout = max(by_layout, key=lambda k: by_layout[k])
    for entry in rounds:  # each round's own ratio, to show the spread
        best = max(entry["limit_by_layout"].values())
        entry["capacity_ratio"] = max(entry["capacity_by_policy"].values()) / best if best else 0.0
    limit = {
        "audio_s_per_s": by_layout[layout],
        "layout": layout,
        "by_layout": by_layout,
        "runs": limit_runs,
        "rounds": rounds,
    }
    return capacity, capacity_run, by_policy, capacity_vs_limit(capacity, limit)


def _mean_by_key(values: Sequence[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.fmean(v[key] for v in values) for key in values[0]}


def _limit_line(run: LimitRun) -> str:
    return f"{run.audio_s_per_s:.2f} audio s per s ({run.audio_s:.0f} s in {run.wall_s:.1f} s)"


def capacity_vs_limit(capacity: float, limit: dict[str, Any] | None) -> dict[str, Any] | None:
    """C, the limit and C / limit, logged in one line."""
    if limit is None:
        return None
    ratio = capacity / limit["audio_s_per_s"] if limit["audio_s_per_s"] > 0 else 0.0
    _log(
        f"C = {capacity:.2f}, limit = {limit['audio_s_per_s']:.2f} ({limit['layout']}): "
        f"C / limit = {ratio:.2f}"
    )
    return {**limit, "capacity_audio_s_per_s": capacity, "capacity_ratio": ratio}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.voice", description=__doc__.split("\n")[0]
    )
    add_common_arguments(
        parser,
        config=CONFIG,
        window=WINDOW,
        factors=FACTORS,
        duration_s=10.0,
        latest="voice-latest",
    )
    parser.add_argument("--requests", type=int, default=12, help="single-stream requests per kind")
    parser.add_argument(
        "--counts",
        default=",".join(map(str, STREAM_COUNTS)),
        help="concurrent streams of the sweep, comma-separated",
    )
    parser.add_argument(
        "--capacity-streams", type=int, default=16, help="clients saturating the capacity run"
    )
    parser.add_argument(
        "--policy-counts",
        default=str(TARGET_STALL_FREE_STREAMS),
        help="policy comparison: fixed N besides the factors",
    )
    parser.add_argument(
        "--extra-windows",
        default=",".join(map(str, EXTRA_WINDOWS)),
        help="edf K=k rows besides the four policies ('' for none)",
    )
    parser.add_argument(
        "--policy-duration", type=float, default=8.0, help="policy comparison: measured window, s"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run (~2 min)")
    parser.add_argument("--no-peer", action="store_true", help="skip piper's server")
    parser.add_argument("--no-policies", action="store_true", help="skip C and the policies")
    parser.add_argument(
        "--limit-seconds", type=float, default=8.0, help="machine limit: seconds per layout"
    )
    parser.add_argument("--no-limit", action="store_true", help="skip the machine's limit")
    parser.add_argument(
        "--capacity-rounds",
        type=int,
        default=2,
        help="rounds of C (both policies) then the limit; each figure is the rounds' mean",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.capacity_rounds < 1:
        parser.error(f"--capacity-rounds must be >= 1, got {args.capacity_rounds}")
    if args.quick:  # one point per policy, short texts (~5 s of audio at most)
        args.requests, args.counts, args.duration, args.max_text_chars = 4, "1,4", 6.0, 90
        args.capacity_duration, args.factors, args.policy_duration = 6.0, "1", 5.0
        args.limit_seconds = 4.0
        args.policy_counts = ""
        args.capacity_rounds = 1
    args.counts = number_list(args.counts, int)
    args.policy_counts = number_list(args.policy_counts, int)
    args.extra_windows = number_list(args.extra_windows, int)
    args.factors = number_list(args.factors, float)
    out_dir = new_run_dir(args.out, "voice-")
    started = time.monotonic()
    bench = Bench(args, out_dir)

    single = bench.single_streams()
    concurrency = {PLAYHEAD: bench.playhead()}
    if not args.no_peer:
        concurrency[PIPER] = bench.piper()
    capacity, n_sat, capacity_run, runs, limit = 0.0, 0, None, [], None
    by_policy: dict[str, float] = {}
    if not args.no_policies:
        n_sat = args.capacity_streams
        capacity, capacity_run, by_policy, limit = capacity_and_limit(bench, args)
        _log(
            f"C = {capacity:.2f} audio s per s (the larger policy's mean of "
            f"{args.capacity_rounds} rounds, no admission, {n_sat} clients)"
        )
        runs = bench.policies(capacity)

    results: dict[str, Any] = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backend": "piper",
        "voice": bench.plan.options.voice,
        "sample_rate_hz": bench.plan.options.sample_rate_hz,
        "response_format": "pcm (Playhead), wav (piper-http)",
        "capacity_audio_s_per_s": capacity,
        "capacity_method": (
            f"audio per second received by a closed loop of {n_sat} clients (each sending "
            f"its next request at the last byte) in [{args.warmup:.0f} s, "
            f"{args.warmup + args.capacity_duration:.0f} s], from the first to the last burst "
            f"of audio inside it (LoadResult.burst_throughput); the larger of fifo without a "
            f"window and edf K={args.window}, both without admission, each the mean of "
            f"{args.capacity_rounds} runs (one per round, the limit measured after each)"
        ),
        "capacity_by_policy": by_policy,
        "max_xrt_seen": max(
            [capacity, *(float(r["xrt"]) for r in [*runs, *concurrency[PLAYHEAD]])]
        ),
        "capacity_run": capacity_run,
        "machine_limit": limit,
        "single_stream": single,
        "concurrency": concurrency,
        "runs": runs,
        "config": config_name(args.config),
        "settings": bench.settings,
        "seed": args.seed,
        "requests_per_kind": args.requests,
        "duration_s": args.duration,
        "policy_duration_s": args.policy_duration,
        "warmup_s": args.warmup,
        "texts": {
            "short_first": list(SHORT_FIRST),
            "long_first": list(LONG_FIRST),
            "load": f"{len(bench.plan.texts)} corpus texts of <= {args.max_text_chars} chars",
        },
        "notes": [
            "Playhead runs configs/default.yaml as served (edf K=1 + admission) for the single "
            "stream and the N sweep; a rejected client waits Retry-After and retries",
            "piper-http: python -m piper.http_server (Flask, one thread per request, ONNX "
            "Runtime defaults); it answers with a whole WAV, so its players never stall: its "
            "cost is TTFA",
            "closed loop: each listener sends its next request when it has heard the last "
            "one to the end (single stream: at the last byte)",
            "stall-free ignores stalls under 10 ms; interruptions are stalls >= 150 ms",
            "RTF = (last byte - request sent) / audio duration: lower is faster",
        ],
        "wall_s": time.monotonic() - started,
    }
    results["seams"] = seam_figures(args)
    results["targets"] = targets(results)
    table = write_voice_report(results, out_dir)
    if not args.no_latest:
        publish_latest(out_dir, args.out, prefix="voice-latest")
    print(table)
    _log(f"wrote {out_dir} in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
