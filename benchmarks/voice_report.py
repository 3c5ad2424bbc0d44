"""The report of `make bench-voice`: its own tables and plots, then benchmarks/report.py's
policy table and plots for the policy comparison (results schema: benchmarks/voice.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.player import STALL_TOLERANCE_S
from benchmarks.report import (
    fmt,
    markdown_table,
    plot_cdf,
    pyplot,
    redraw_args,
    save_figure,
    write_report,
    write_results_json,
)
from benchmarks.voice_targets import targets

SERVER_NAMES = {"playhead": "Playhead", "piper-http": "piper HTTP server"}


def _name(server: str) -> str:
    return SERVER_NAMES.get(server, server)


def voice_tables(results: Mapping[str, Any]) -> str:
    lines = [
        f"Real voice {results['voice']} ({results['machine']}, {results['date']}); Playhead "
        f"pcm at {results['sample_rate_hz']} Hz, piper's server WAV.",
        "",
        "Single stream, both servers running, each text sent to one and then the other (the "
        "order swapping text by text), one request at a time (TTFA = request sent -> first "
        "audio byte; RTF = end-to-end time / audio duration, lower is faster):",
        "",
        "| server | first sentence | requests | TTFA p50 / p95 (ms) | RTF p50 / p95 "
        "| audio per request (s) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for server, kinds in results["single_stream"].items():
        for kind, r in kinds.items():
            label = "short" if kind == "short" else "30+ words"
            lines.append(
                f"| {_name(server)} | {label} | {r['streams_ok']} "
                f"| {fmt(r['ttfa_p50_ms'])} / {fmt(r['ttfa_p95_ms'])} "
                f"| {fmt(r['rtf_p50'], '.3f')} / {fmt(r['rtf_p95'], '.3f')} "
                f"| {fmt(r['audio_s_mean'], '.1f')} |"
            )
    lines += [
        "",
        "N concurrent streams, closed loop (xRT = audio seconds received per wall second):",
        "",
        "| server | N | xRT | stall ratio | stall-free streams | interruptions "
        "| TTFA p50 / p95 / p99 (ms) | RTF p50 | rejected (429) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for server, rows in results["concurrency"].items():
        for r in rows:
            ttfa = " / ".join(fmt(r[k]) for k in ("ttfa_p50_ms", "ttfa_p95_ms", "ttfa_p99_ms"))
            lines.append(
                f"| {_name(server)} | {r['streams']} | {r['xrt']:.2f} | {r['stall_ratio']:.3f} "
                f"| {r['stall_free_streams']}/{r['streams_ok']} | {r['interruptions']} | {ttfa} "
                f"| {fmt(r['rtf_p50'], '.3f')} | {r['rejected']} |"
            )
    t = results.get("targets") or {}
    if t:
        best = t["best"]
        per_config = ", ".join(f"{k}: {v}" for k, v in t["most_streams_all_stall_free"].items())
        lines += [
            "",
            f"Targets: TTFA p50 (short first sentence, one stream) "
            f"{fmt(t['ttfa_p50_short_ms'], '.2f')} ms vs <= "
            f"{t['ttfa_p50_short_target_ms']:.0f} ms: {'met' if t['ttfa_met'] else 'MISSED'}. "
            f"Concurrent streams all playing without "
            f"a stall (and no 429): {best['streams']} ({best['config']}) vs >= "
            f"{t['stall_free_streams_target']}: {'met' if t['stall_free_met'] else 'MISSED'} "
            f"(largest such N measured, per config: {per_config}).",
        ]
        lines += _at_0_9c_targets(t)
        lines += _machine_targets(t)
    lines += [
        "",
        f"Stall-free ignores stalls under {STALL_TOLERANCE_S * 1000:.0f} ms. piper's server "
        "sends a whole WAV after synthesising the whole text, so its players never stall; "
        "it pays in TTFA. In the N table each listener sends its next request once it has "
        "heard the last one, so xRT is about N when nothing stalls; it counts the audio "
        "received from the first measured request to the last byte of the last measured "
        "stream, so at N = 1 (one measured stream) it is that stream's delivery speed.",
        "",
    ]
    return "\n".join(lines)


def _at_0_9c_targets(t: Mapping[str, Any]) -> list[str]:
    """The N = 0.9 C target, per served policy; with the server's split of a first audio
    where the run has it (Server-Timing, from 2026-12-02)."""
    lines = []
    for label, row in (t.get("at_0_9c") or {}).items():
        line = (
            f"At N = 0.9 C ({row['streams']} streams), {label}: "
            f"{100 * row['stall_free_share']:.0f}% stall-free, TTFA p99 "
            f"{fmt(row['ttfa_p99_ms'])} ms vs < {t['at_0_9c_ttfa_p99_target_ms']:.0f} ms "
            f"({row['rejected']} x 429): {'met' if row['met'] else 'MISSED'}."
        )
        wait, first = row.get("server_start_wait_p99_ms"), row.get("server_first_audio_p99_ms")
        if wait is not None or first is not None:
            line += (
                f" The server's split (Server-Timing), p99: waiting for a start slot "
                f"{fmt(wait)} ms, submit to first audio {fmt(first)} ms."
            )
        lines.append(line)
    return lines


def _machine_targets(t: Mapping[str, Any]) -> list[str]:
    """The targets on the whole machine (C against its limit, seams, a single request's RTF
    against piper's server), one line each; those not measured in the run are left out."""
    lines = []
    if t.get("capacity_ratio") is not None:
        lines.append(
            f"C / limit {t['capacity_ratio']:.2f} vs >= {t['capacity_ratio_target']:.1f}: "
            f"{'met' if t['capacity_ratio_met'] else 'MISSED'}."
        )
    if t.get("seams_worst_db") is not None:
        lines.append(
            f"Seams against whole-segment synthesis: worst {t['seams_worst_db']:.1f} dB "
            f"(median {t['seams_median_db']:.1f}) vs >= {t['seams_target_db']:.0f} dB: "
            f"{'met' if t['seams_met'] else 'MISSED'}."
        )
    rtf = t.get("rtf_vs_peer") or {}
    if rtf:
        each = "; ".join(
            f"{'short' if kind == 'short' else '30+ word'} first sentence {r['playhead']:.3f} "
            f"vs {r['peer']:.3f} ({r['ratio']:.2f}x)"
            for kind, r in rtf.items()
        )
        met = all(r["met"] for r in rtf.values())
        lines.append(
            f"Single-request RTF p50 against piper's server: {each}, vs <= "
            f"{t['rtf_vs_peer_target']:.0f}x: {'met' if met else 'MISSED'}."
        )
    return lines


LOG_TICKS_MS = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def _ms_log_axis(axis: Any, values: list[float]) -> None:
    """Log scale with plain millisecond labels at 1-2-5 steps covering `values`."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    finite = [v for v in values if v == v and v > 0]
    if finite:
        low, high = min(finite) / 1.5, max(finite) * 1.5
        axis.set_ticks([t for t in LOG_TICKS_MS if low <= t <= high] or [100])
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(NullFormatter())


def plot_concurrency(results: Mapping[str, Any], path: Path) -> None:
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 4))
    top = 1
    for server, rows in results["concurrency"].items():
        ns = [r["streams"] for r in rows]
        top = max(top, *ns)
        left.plot(ns, [r["xrt"] for r in rows], marker="o", label=_name(server))
        right.plot(ns, [r["ttfa_p50_ms"] or float("nan") for r in rows], marker="o",
                   label=f"{_name(server)} p50")  # fmt: skip
        right.plot(ns, [r["ttfa_p95_ms"] or float("nan") for r in rows], marker="x",
                   linestyle="--", label=f"{_name(server)} p95")  # fmt: skip
    left.plot([0, top], [0, top], "k:", linewidth=1, label="N players at 1x")
    capacity = results.get("capacity_audio_s_per_s") or 0.0
    if capacity:
        left.axhline(
            capacity, color="grey", linestyle="--", linewidth=1, label=f"C = {capacity:.1f}"
        )
    left.set_xlabel("concurrent streams N")
    left.set_ylabel("xRT (audio s per wall s)")
    left.set_title("Throughput")
    right.set_yscale("log")
    _ms_log_axis(
        right.yaxis,
        [
            r[k] or float("nan")
            for rows in results["concurrency"].values()
            for r in rows
            for k in ("ttfa_p50_ms", "ttfa_p95_ms")
        ],
    )
    right.set_xlabel("concurrent streams N")
    right.set_ylabel("TTFA (ms)")
    right.set_title("Time to first audio")
    save_figure(fig, path, (left, right), legend_fontsize=7)


def plot_single_ttfa(results: Mapping[str, Any], path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for server, kinds in results["single_stream"].items():
        for kind, r in kinds.items():
            plot_cdf(ax, r["ttfa_ms"], f"{_name(server)}, {kind} first sentence")
    ax.set_xscale("log")
    _ms_log_axis(
        ax.xaxis,
        [
            t
            for kinds in results["single_stream"].values()
            for r in kinds.values()
            for t in r["ttfa_ms"]
        ],
    )
    ax.set_xlabel("TTFA (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title("Single stream TTFA")
    save_figure(fig, path, [ax], legend_fontsize=7)


def limit_line(results: Mapping[str, Any]) -> str:
    """C against the machine's limit (benchmarks/voice_limit.py), one line; '' if unmeasured."""
    limit = results.get("machine_limit")
    if not limit:
        return ""
    by_layout = limit.get("by_layout") or {r["layout"]: r["audio_s_per_s"] for r in limit["runs"]}
    layouts = ", ".join(f"{layout}: {value:.2f}" for layout, value in by_layout.items())
    by_policy = results.get("capacity_by_policy") or {}
    measured = ", ".join(f"{label} {value:.2f}" for label, value in by_policy.items())
    rounds = limit.get("rounds") or []
    means = f", each the mean of {len(rounds)} runs" if len(rounds) > 1 else ""
    source = f" (the larger of {measured}, saturated, no admission{means})" if measured else ""
    spread = ""
    if len(rounds) > 1:
        each = ", ".join(f"{r['capacity_ratio']:.2f}" for r in rounds)
        spread = f" (round by round, C then the limit right after: {each})"
    return (
        f"Capacity against the machine's limit: C = {limit['capacity_audio_s_per_s']:.2f} audio "
        f"s per s{source}; limit = {limit['audio_s_per_s']:.2f} (piper's whole model, best layout "
        f"{limit['layout']} processes x threads; {layouts}{means}); C / limit = "
        f"{limit['capacity_ratio']:.2f}{spread}.\n"
    )


def write_voice_report(results: Mapping[str, Any], out_dir: Path) -> str:
    """results.json, table.md and every plot into `out_dir`; returns the table."""
    table = voice_tables(results) + limit_line(results)
    if results["runs"]:
        write_report(results, out_dir)  # results.json, the policy table and plots
        table += "\nPolicy comparison on the real voice:\n\n" + markdown_table(results)
    else:
        write_results_json(results, out_dir)
    (out_dir / "table.md").write_text(table, encoding="utf-8")
    plot_concurrency(results, out_dir / "concurrency.png")
    plot_single_ttfa(results, out_dir / "single_stream_ttfa.png")
    return table


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.voice_report results.json [out_dir]`: redraw a report, its
    targets worked out again from the figures (as the code now states them)."""
    results, out_dir = redraw_args(argv, main.__doc__)
    results["targets"] = targets(results)
    print(write_voice_report(results, out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
