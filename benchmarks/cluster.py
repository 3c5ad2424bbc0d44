"""`make bench-cluster`: Playhead replicas on Ray Serve, Ray's default router vs the slack
router, on the sim backend (its costs are sleeps, so several replicas share this machine).

    python -m benchmarks.cluster [--replicas 1,2,4] [--factors ...] [--quick]

1. C1, one replica's capacity: a plain `playhead serve` (fifo, no window) saturated as in
   `make bench` (benchmarks/bench.py measure_capacity). A cluster of R replicas has
   C = R x C1.
2. The hop: TTFA of one listener at a time (each request sent at the previous one's last
   byte), against the plain server and against a one-replica cluster (Ray's HTTP proxy,
   then the replica): the difference of the p50s is what the proxy hop costs.
3. One cluster per (replicas, router): `playhead serve --replicas R --set
   cluster.router=...` with edf K=4 and admission (configs/sim.yaml), swept over
   N = factors x C listeners in a closed loop, the same client-side player as `make bench`
   (benchmarks/loadgen.py, benchmarks/player.py). With one replica there is nothing to
   route: it runs once.
4. benchmarks/results/cluster-<timestamp>/: results.json, table.md, clusters.png
   (stall-free share, TTFA p99 and listeners served against N / C, one line per
   cluster), ttfa_cdf.png; copied to
   benchmarks/results/cluster-latest.json and cluster-latest/.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench import (
    BENCH_SETTINGS,
    CONFIG,
    EXPECTED_CAPACITY,
    LoadPlan,
    Policy,
    add_common_arguments,
    config_name,
    free_port,
    machine,
    measure_capacity,
    new_run_dir,
    number_list,
    run_load,
    run_row,
    serve,
    server_process,
)
from benchmarks.loadgen import RequestOptions, load_corpus
from benchmarks.player import percentile
from benchmarks.report import (
    MARKERS,
    STALL_FREE_SHARE,
    fmt,
    labels_in_order,
    meets_slo,
    plot_ttfa_cdf,
    publish_latest,
    pyplot,
    run_label,
    save_figure,
    write_results_json,
)

FACTORS = (0.5, 0.75, 0.95, 1.5, 2.0)
POLICY = Policy("edf", 4, True)  # the engine each replica runs: edf K=4 + admission
ROUTERS = ("default", "slack")
HOP_WINDOW_S = 12.0


def _log(message: str) -> None:
    print(f"[bench-cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def cluster(
    config: Path, settings: Sequence[str], replicas: int, router: str, log_path: Path
) -> Iterator[str]:
    """`playhead serve --replicas R` as a subprocess (a local Ray); yields its URL once
    /ready reports every replica running."""
    port = free_port()
    command = [sys.executable, "-m", "app", "serve", "--config", str(config)]
    command += ["--port", str(port), "--replicas", str(replicas)]
    for item in [*settings, f"cluster.router={router}"]:
        command += ["--set", item]
    with server_process(command, port, log_path, name="cluster", timeout_s=180) as url:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                body = httpx.get(f"{url}/ready", timeout=5).json()
                if body.get("replicas", {}).get("running") == replicas:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replicas} replicas not running; see {log_path}")
            time.sleep(0.2)
        yield url


def hop_ttfa(url: str, plan: LoadPlan) -> dict[str, Any]:
    """TTFA of one listener at a time (next request at the last byte)."""
    hop_plan = LoadPlan(
        texts=plan.texts, options=plan.options, warmup_s=1.0, capacity_duration_s=HOP_WINDOW_S
    )
    result = run_load(url, 1, hop_plan, capacity=True)
    ttfas_ms = sorted(t * 1000.0 for t in result.ttfas_s())
    return {
        "requests": len(ttfas_ms),
        "ttfa_p50_ms": percentile(ttfas_ms, 50),
        "ttfa_p90_ms": percentile(ttfas_ms, 90),
        "ttfa_ms": [round(t, 2) for t in ttfas_ms],
    }


def measure_hop(
    config: Path, settings: Sequence[str], plan: LoadPlan, out_dir: Path
) -> dict[str, Any]:
    """TTFA of one listener at a time: a plain server, then a one-replica cluster."""
    with serve(config, settings, out_dir / "server-plain.log") as url:
        plain = hop_ttfa(url, plan)
    with cluster(config, settings, 1, "slack", out_dir / "cluster-hop.log") as url:
        through = hop_ttfa(url, plan)
    _log(f"hop: TTFA p50 {plain['ttfa_p50_ms']:.1f} -> {through['ttfa_p50_ms']:.1f} ms")
    return {
        "plain": plain,
        "cluster": through,
        "cost_p50_ms": through["ttfa_p50_ms"] - plain["ttfa_p50_ms"],
    }


def cluster_row(replicas: int, router: str, n: int, result: Any, c1: float) -> dict[str, Any]:
    capacity = replicas * c1
    row = run_row(POLICY, result, capacity)
    noun = "replica" if replicas == 1 else "replicas"
    row["label"] = f"{replicas} {noun}" + ("" if replicas == 1 else f", {router} router")
    row.update(replicas=replicas, router=router, cluster_capacity=capacity)
    return row


def stall_free_capacity(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per cluster: the largest N meeting the SLO with every smaller N meeting it too."""
    out = {}
    for label in labels_in_order(runs):
        rows = sorted((r for r in runs if run_label(r) == label), key=lambda r: r["streams"])
        best = 0.0
        for row in rows:
            if not meets_slo(row):
                break
            best = float(row["streams"])
        served = max((r["listening_mean"] for r in rows if r["streams"] <= best), default=0.0)
        out[label] = {
            "streams": best,
            "per_c": best / rows[0]["cluster_capacity"],
            "served": served,
        }
    return out


def markdown_table(results: dict[str, Any]) -> str:
    c1 = results["capacity_audio_s_per_s"]
    hop = results.get("hop")
    lines = [
        f"One replica's capacity C1 = {c1:.2f} audio s per wall s; a cluster of R replicas "
        f"has C = R x C1 (sim backend, {results['machine']}, {results['date']}). Each "
        "replica runs edf K=4 + admission.",
        "",
        "| cluster | N | N/C | listening | stall-free | stall ratio | interruptions "
        "| TTFA p50 / p99 (ms) | rejected (429) | failed | xRT |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    runs = results["runs"]
    for label in labels_in_order(runs):
        for r in sorted((r for r in runs if run_label(r) == label), key=lambda r: r["streams"]):
            lines.append(
                f"| {label} | {r['streams']} | {r['streams'] / r['cluster_capacity']:.2f} "
                f"| {r['listening_mean']:.1f} | {100 * r['stall_free_share']:.1f}% "
                f"| {r['stall_ratio']:.3f} "
                f"| {r['interruptions']} | {fmt(r['ttfa_p50_ms'])} / {fmt(r['ttfa_p99_ms'])} "
                f"| {r['rejected']} | {r['streams_failed']} | {r['xrt']:.2f} |"
            )
    lines += [
        "",
        f"Stall-free capacity (largest N with >= {100 * STALL_FREE_SHARE:.0f}% stall-free "
        "streams and TTFA p99 <= 1 s, every smaller N too):",
        "",
    ]
    for label, cap in results["stall_free_capacity"].items():
        lines.append(
            f"- {label}: N = {cap['streams']:g} ({cap['per_c']:.2f} C); at most "
            f"{cap['served']:.1f} listeners served at once up to there"
        )
    if hop is None:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"The proxy hop: TTFA p50 of one listener at a time, {hop['plain']['ttfa_p50_ms']:.1f} ms "
        f"from a plain `playhead serve`, {hop['cluster']['ttfa_p50_ms']:.1f} ms through Ray "
        f"Serve's proxy to one replica: +{hop['cost_p50_ms']:.1f} ms "
        f"({hop['plain']['requests']} and {hop['cluster']['requests']} requests).",
    ]
    return "\n".join(lines) + "\n"


def plot_clusters(results: dict[str, Any], path: Path) -> None:
    """Three panels against N / C, one line per cluster: stall-free share, TTFA p99, and
    listeners served (time-averaged players, the scale-out figure)."""
    fig, axes = pyplot().subplots(1, 3, figsize=(14, 4.2))
    runs = results["runs"]
    for i, label in enumerate(labels_in_order(runs)):
        rows = sorted((r for r in runs if run_label(r) == label), key=lambda r: r["streams"])
        x = [r["streams"] / r["cluster_capacity"] for r in rows]
        style = {"marker": MARKERS[i % len(MARKERS)], "alpha": 0.85, "label": label}
        axes[0].plot(x, [100 * r["stall_free_share"] for r in rows], **style)
        axes[1].plot(x, [r["ttfa_p99_ms"] or 0 for r in rows], **style)
        axes[2].plot(x, [r["listening_mean"] for r in rows], **style)
    axes[0].axhline(100 * STALL_FREE_SHARE, color="grey", linestyle=":", linewidth=1)
    axes[0].set_ylim(-2, 102)
    axes[0].set_ylabel("stall-free streams (%)")
    axes[1].set_ylabel("TTFA p99 (ms)")
    axes[2].set_ylabel("listeners served (time-averaged players)")
    titles = ("Stall-free share", "TTFA p99", "Listeners served")
    for ax, title in zip(axes, titles, strict=True):
        ax.axvline(0.95, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("listeners N / cluster capacity C")
        ax.set_title(title)
    save_figure(fig, path, axes, legend_fontsize=7)


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    write_results_json(results, out_dir)
    (out_dir / "table.md").write_text(markdown_table(results), encoding="utf-8")
    plot_clusters(results, out_dir / "clusters.png")
    # TTFA CDFs per N: the N/C axis differs per cluster, so one panel per factor instead.
    by_factor = {**results, "runs": [{**r, "streams": r["factor"]} for r in results["runs"]]}
    by_factor["capacity_audio_s_per_s"] = 1.0
    plot_ttfa_cdf(by_factor, out_dir / "ttfa_cdf.png")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cluster", description=__doc__.split("\n")[0]
    )
    add_common_arguments(
        parser, config=CONFIG, window=4, factors=FACTORS, duration_s=12.0, latest="cluster-latest"
    )
    parser.add_argument("--replicas", default="1,2,4", help="cluster sizes, comma-separated")
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--format", default="pcm", help="response_format (default pcm)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 and 2, 2 points")
    parser.add_argument(
        "--c1", type=float, default=None, help="one replica's capacity, known (skips measuring it)"
    )
    parser.add_argument("--no-hop", action="store_true", help="skip the hop measurement")
    args = parser.parse_args(argv)
    if args.quick:
        args.replicas, args.factors = "1,2", "0.5,0.95"
        args.duration = args.capacity_duration = 5.0

    plan = LoadPlan(
        texts=tuple(t for t in load_corpus() if len(t) <= args.max_text_chars),
        options=RequestOptions(voice="sim", response_format=args.format),
        duration_s=args.duration,
        warmup_s=args.warmup,
        capacity_duration_s=args.capacity_duration,
        seed=args.seed,
    )
    out_dir = new_run_dir(args.out, "cluster-")
    settings = [*BENCH_SETTINGS, *POLICY.overrides(), *args.overrides]
    started = time.monotonic()

    n_sat = round(2.5 * EXPECTED_CAPACITY)
    c1 = args.c1
    if c1 is None:
        log_path = out_dir / "server-capacity.log"
        c1, _ = measure_capacity(args.config, settings, n_sat, plan, log_path)
    _log(f"C1 = {c1:.2f} audio s per s")
    hop = None if args.no_hop else measure_hop(args.config, settings, plan, out_dir)

    factors = number_list(args.factors, float)
    runs: list[dict[str, Any]] = []
    for replicas in number_list(args.replicas, int):
        routers = ["slack"] if replicas == 1 else number_list(args.routers, str)
        for router in routers:
            log_path = out_dir / f"cluster-{replicas}-{router}.log"
            with cluster(args.config, settings, replicas, router, log_path) as url:
                for factor in factors:
                    n = max(1, round(factor * replicas * c1))
                    row = cluster_row(replicas, router, n, run_load(url, n, plan), c1)
                    row["factor"] = factor
                    runs.append(row)
                    _log(
                        f"{row['label']:28s} N={n:3d} ({factor:.2f} C) stall-free "
                        f"{100 * row['stall_free_share']:.1f}% TTFA p50 "
                        f"{row['ttfa_p50_ms'] or 0:.0f} ms rejected {row['rejected']} "
                        f"failed {row['streams_failed']} xRT {row['xrt']:.2f}"
                    )
                    time.sleep(1.0)

    results: dict[str, Any] = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backend": "sim",
        "capacity_audio_s_per_s": c1,
        "config": config_name(args.config),
        "settings": settings,
        "seed": args.seed,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "hop": hop,
        "runs": runs,
    }
    results["stall_free_capacity"] = stall_free_capacity(runs)
    results["wall_s"] = time.monotonic() - started
    write_report(results, out_dir)
    if not args.no_latest:
        publish_latest(out_dir, args.out, prefix="cluster-latest")
    print(markdown_table(results))
    _log(f"wrote {out_dir} in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
