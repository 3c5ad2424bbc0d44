"""A discrete-event simulation of Playhead's engine at scale, in virtual time.

`make sim` (python -m benchmarks.simulate) answers capacity-planning questions the machine
here cannot: 10^3..10^5 streams, closed-loop or Poisson arrivals, several replicas behind a
router. Each replica (benchmarks/sim_replica.py) is the engine's own StreamBook and the
sim backend, with the engine's two stage loops as event handlers: every decision (talker
order, vocoder selection, chunk planning, admission, the ledger of players still playing)
is the engine's scheduling/ and pipeline/ code, and the costs are the sim backend's
(pipeline/config.py SimConfig, the only cost model):

- talker: each step runs up to `talker.batch` open segments chosen by the book's
  scheduling.TalkerQueue (the indexed plan_talker_step), as in the engine; each gets
  `talker_frames_per_step` frames; a step costs
  `talker_step_base_ms + talker_step_per_stream_ms * segments`;
- vocoder: each turn decodes the chunks PlaybackScheduler.select picks, for
  `vocoder_base_ms + vocoder_per_frame_ms * frames` (context included; base once per
  batched call), emitted when the turn ends; the two stages overlap;
- admission: scheduling.Admission, fed the engine's capacity estimate
  (pipeline/capacity.py) and the book's playing streams and finish times.

tests/test_engine_vs_simulator.py drives the real Engine (sim backend, virtual clock) and
a replica with the same arrivals and checks they make the same choices in the same order.

Each stream is played by the same 1x player as the load generator's (benchmarks/player.py)
at its emission times, and reported through the same `summarize`.

Routers: `random`; `least-loaded` (fewest streams with work left, known to the router at
once); `slack` (each replica reports, every `report_interval_s`, its streams' minimum and
mean slack = horizon - now, or the first-chunk deadline - now before first audio; infinite
when idle; the ranking is scheduling.rank_replicas, the Ray Serve router's own: two
replicas drawn at random, the one with the higher minimum slack first (a stream sent
there since the report counts with its first-chunk deadline), then the higher mean, then
fewer streams: with stale reports, always taking the best replica would herd a whole
interval's arrivals onto it). A router offers a
request to the replicas in its order until one admits it. A rejected closed-loop client
retries after Retry-After; a rejected Poisson arrival is lost. A closed-loop listener sends
its next request when its player has played the last sample (as the load generator's
default). Clients may hang up mid-stream (`hangup_share`): the replica cancels the stream,
which leaves the playing ledger at once.

The pieces: benchmarks/sim_scenario.py (a run's scenario, its texts, its result),
benchmarks/sim_run.py (the event queue, clients and routers; `run_script`), this module
(plans of scenarios, in worker processes, the table and the CLI).

The bound uses C = the replicas' vocoder throughput with full turns of K steady chunks
(K = 0: of one chunk per concurrent stream), from the sim backend's costs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.loadgen import load_corpus
from benchmarks.sim_run import simulate
from benchmarks.sim_scenario import (
    DEFAULT_SIM,
    DEFAULT_TEXT,
    DEFAULT_WINDOW,
    RESULTS_DIR,
    ROUTERS,
    VIRTUAL_HEADROOM,
    Scenario,
    SimResult,
    mean_audio_s,
    prepare_texts,
    replica_capacity,
)
from scheduling import AdmissionConfig, SchedulingConfig


def _simulate_quietly(scenario: Scenario) -> SimResult:
    """A worker's run: the per-stream records stay behind (the rows do not need them)."""
    return replace(simulate(scenario), records=())


def _progress(res: SimResult) -> None:
    row = res.row()
    print(
        f"{row['label']}: {row['requests']} requests, N/C {row['streams_per_capacity']:.2f}, "
        f"stall ratio {row['stall_ratio']:.3f} (bound {row['stall_ratio_bound']:.3f}), "
        f"stall-free {100 * row['stall_free_share']:.1f}%, TTFA p99 "
        f"{row['ttfa_p99_ms'] or 0:.0f} ms, rejected {row['rejected']}, "
        f"{res.events} events in {res.wall_s:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def run_plan(plan: Sequence[Scenario], jobs: int = 1) -> list[SimResult]:
    """Every scenario of `plan`, in its order; `jobs` > 1 runs them in worker processes
    (largest first). Each run is seeded: the figures do not depend on `jobs`."""
    if jobs <= 1 or len(plan) <= 1:
        results = []
        for sc in plan:
            results.append(simulate(sc))
            _progress(results[-1])
        return results
    done: dict[int, SimResult] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        largest_first = sorted(range(len(plan)), key=lambda i: -plan[i].streams)
        futures = {pool.submit(_simulate_quietly, plan[i]): i for i in largest_first}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            _progress(done[futures[future]])
    return [done[i] for i in range(len(plan))]


POLICIES: dict[str, tuple[str, int, bool]] = {
    # label -> (policy, window (None-like 0 = no window), admission)
    "fifo K=0": ("fifo", 0, False),
    "fifo K": ("fifo", DEFAULT_WINDOW, False),
    "edf K": ("edf", DEFAULT_WINDOW, False),
    "edf K + admission": ("edf", DEFAULT_WINDOW, True),
}


def policy_scenario(name: str, window: int, **kw: object) -> Scenario:
    policy, k, admission = POLICIES[name]
    k = window if k else 0
    label = f"{policy} K={k}" + (" + admission" if admission else "")
    return Scenario(
        label=label,
        scheduling=SchedulingConfig(policy=policy, active_stream_window=k),
        admission=AdmissionConfig(enabled=admission, capacity_headroom=VIRTUAL_HEADROOM),
        **kw,  # type: ignore[arg-type]
    )


def _corpus_mean_audio_s() -> float:
    """Mean audio of a corpus text with the default text options and costs."""
    return mean_audio_s(prepare_texts(load_corpus(), DEFAULT_TEXT, DEFAULT_SIM))


def default_plan(quick: bool = False, window: int = DEFAULT_WINDOW) -> list[Scenario]:
    """`make sim`: policies on one replica over N; routers on four; one 10^5-stream run."""
    c = replica_capacity(window)
    plan: list[Scenario] = []
    per_point = 400 if quick else 2000
    for factor in (0.5, 0.9, 1.0, 1.5, 2.0):
        clients = max(1, round(factor * c))
        for name in POLICIES:
            plan.append(policy_scenario(name, window, streams=per_point, clients=clients))
    plan.append(
        replace(
            policy_scenario(
                "edf K + admission",
                window,
                streams=per_point,
                clients=round(1.5 * c),
                hangup_share=0.3,
            ),
            label=f"edf K={window} + admission, 30% hang up mid-stream",
        )
    )
    replicas = 4
    rate = 0.95 * replicas * c / _corpus_mean_audio_s()
    for router in ROUTERS:
        plan.append(
            Scenario(
                label=f"edf K={window}, {replicas} replicas, {router}, Poisson 0.95 C",
                streams=2000 if quick else 10_000,
                rate_per_s=rate,
                replicas=replicas,
                router=router,
                scheduling=SchedulingConfig(policy="edf", active_stream_window=window),
            )
        )
    plan.append(
        Scenario(
            label=f"edf K={window} + admission, {replicas} replicas, slack, Poisson 1.2 C",
            streams=5000 if quick else 100_000,
            rate_per_s=rate / 0.95 * 1.2,
            replicas=replicas,
            router="slack",
            scheduling=SchedulingConfig(policy="edf", active_stream_window=window),
            admission=AdmissionConfig(enabled=True, capacity_headroom=VIRTUAL_HEADROOM),
        )
    )
    return plan


def format_table(results: Sequence[SimResult]) -> str:
    """Markdown table of simulation runs, with its notes."""
    lines = [
        "| scenario | requests | N or load | N/C | stall ratio | bound | bound (L) "
        "| stall-free | interruptions | TTFA p50/p95/p99 ms | rejected | hung up | xRT | sim s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        row = res.row()
        ttfa = " / ".join(
            "–" if row[k] is None else f"{row[k]:.0f}"
            for k in ("ttfa_p50_ms", "ttfa_p95_ms", "ttfa_p99_ms")
        )
        lines.append(
            f"| {row['label']} | {row['requests']} | {row['streams']:.1f} "
            f"| {row['streams_per_capacity']:.2f} | {row['stall_ratio']:.3f} "
            f"| {row['stall_ratio_bound']:.3f} | {row['stall_ratio_bound_listening']:.3f} "
            f"| {100 * row['stall_free_share']:.1f}% "
            f"| {row['interruptions']} | {ttfa} | {row['rejected']} | {row['hangups']} "
            f"| {row['xrt']:.1f} "
            f"| {row['sim_wall_s']:.1f} |"
        )
    lines += [
        "",
        "N or load: concurrent clients (closed loop) or offered audio seconds per second "
        "(Poisson). Bound: max(0, N/C - 1). Bound (L): max(0, L/C - 1) with L the "
        "time-averaged number of players between first audio and end of playback (in a "
        "closed loop, time waiting for first audio is no stall, so L < N when streams wait). "
        "Stall-free ignores stalls under 10 ms. Hung up: measured streams whose client left "
        "mid-stream (not counted as served). Sim s: wall seconds the simulation took.",
    ]
    return "\n".join(lines) + "\n"


def _scenario_json(sc: Scenario) -> dict[str, object]:
    data = asdict(sc)
    data["chunking"]["ramp"] = list(sc.chunking.ramp)
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.simulate",
        description="Discrete-event simulation of Playhead's scheduling at scale.",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller default plan")
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, help=f"K (default {DEFAULT_WINDOW})"
    )
    parser.add_argument("--policy", choices=list(POLICIES), help="run one scenario of this policy")
    parser.add_argument("--streams", type=int, default=10_000, help="measured requests (one run)")
    parser.add_argument("--clients", type=float, help="closed loop: N as a multiple of C")
    parser.add_argument("--rate", type=float, help="Poisson: offered load as a multiple of C")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--router", choices=ROUTERS, default="least-loaded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="scenarios run in parallel processes (results do not depend on it)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/)")
    args = parser.parse_args(argv)

    if args.policy:
        c = args.replicas * replica_capacity(args.window)
        kw: dict[str, object] = {
            "streams": args.streams,
            "replicas": args.replicas,
            "router": args.router,
            "seed": args.seed,
        }
        if args.rate is not None:
            kw["rate_per_s"] = args.rate * c / _corpus_mean_audio_s()
        else:
            kw["clients"] = max(1, round((args.clients or 1.0) * c))
        plan = [policy_scenario(args.policy, args.window, **kw)]
    else:
        plan = [replace(sc, seed=args.seed) for sc in default_plan(args.quick, args.window)]

    results = run_plan(plan, args.jobs)
    rows = [res.row() for res in results]
    table = format_table(results)
    print(table)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS_DIR / f"sim-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "date": stamp,
        "kind": "simulation",
        "runs": [
            {**row, "scenario": _scenario_json(res.scenario)}
            for row, res in zip(rows, results, strict=True)
        ],
    }
    out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    if args.out is None and not args.policy:  # the default plan: the copy the README shows
        (RESULTS_DIR / "sim-latest.json").write_text(out.read_text(encoding="utf-8"))
        (RESULTS_DIR / "sim-latest.md").write_text(table, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
