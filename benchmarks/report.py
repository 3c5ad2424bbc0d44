"""Benchmark reports: results.json, the Markdown table the README shows, and PNG plots.

Works on the results dict (schema in benchmarks/bench.py's docstring), so the sim bench,
the real-voice bench and the simulator can share it: every run needs `label` (or policy,
window, admission), `streams`, the metric fields, and optionally `ttfa_ms` (the samples,
for the CDF plot).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.player import INTERRUPTION_S, STALL_TOLERANCE_S, stall_ratio_bound

STALL_FREE_SHARE = 0.99  # stall-free capacity: >= 99% stall-free streams ...
TTFA_P99_LIMIT_MS = 1000.0  # ... and TTFA p99 <= 1 s

Run = Mapping[str, Any]
MARKERS = ("o", "s", "^", "D", "v", "P")  # overlapping lines stay visible


def run_label(run: Run) -> str:
    if run.get("label"):
        return str(run["label"])
    label = f"{run['policy']} K={run['window']}"
    return label + (" + admission" if run.get("admission") else "")


def labels_in_order(runs: Iterable[Run]) -> list[str]:
    seen: dict[str, None] = {}
    for run in runs:
        seen.setdefault(run_label(run), None)
    return list(seen)


def meets_slo(run: Run) -> bool:
    p99 = run.get("ttfa_p99_ms")
    return (
        run.get("stall_free_share", 0.0) >= STALL_FREE_SHARE
        and p99 is not None
        and p99 <= TTFA_P99_LIMIT_MS
    )


def stall_free_capacity(runs: Sequence[Run]) -> dict[str, float]:
    """Per label: the largest N of the sweep with >= 99% stall-free and TTFA p99 <= 1 s,
    provided every smaller N met it too (0 when the smallest already failed)."""
    out: dict[str, float] = {}
    for label in labels_in_order(runs):
        best = 0.0
        for run in sorted((r for r in runs if run_label(r) == label), key=lambda r: r["streams"]):
            if not meets_slo(run):
                break
            best = float(run["streams"])
        out[label] = best
    return out


def fmt(value: Any, spec: str = ".0f", none: str = "–") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    return format(value, spec)


def markdown_table(results: Mapping[str, Any]) -> str:
    """The table the README shows, with its notes."""
    capacity = float(results["capacity_audio_s_per_s"])
    runs = results["runs"]
    lines = [
        f"Vocoder capacity C = {capacity:.2f} audio s per wall s "
        f"({results.get('backend', '?')} backend, {results.get('machine', '?')}, "
        f"{results.get('date', '?')}).",
        "",
        "| policy | N | N/C | listening | stall ratio | bound | stall-free | interruptions "
        "| TTFA p50 / p95 / p99 (ms) | rejected (429) | xRT |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in labels_in_order(runs):
        for run in sorted((r for r in runs if run_label(r) == label), key=lambda r: r["streams"]):
            n = run["streams"]
            bound = run.get("stall_ratio_bound", stall_ratio_bound(n, capacity))
            ttfa = " / ".join(
                fmt(run.get(k)) for k in ("ttfa_p50_ms", "ttfa_p95_ms", "ttfa_p99_ms")
            )
            lines.append(
                f"| {label} | {n} | {n / capacity:.2f} | {fmt(run.get('listening_mean'), '.1f')} "
                f"| {run['stall_ratio']:.3f} | {bound:.3f} "
                f"| {100 * run['stall_free_share']:.1f}% | {run['interruptions']} | {ttfa} "
                f"| {run['rejected']} | {run['xrt']:.2f} |"
            )
    admitted = [r for r in runs if r.get("admission")]
    if admitted:  # what admission costs and gives (docs/admission.md)
        lines += [
            "",
            "| with admission | N/C | share playing (listening / C) | xRT / C "
            "| 429s | 429 answered p50 / p99 (ms) | first try -> admitted p99 (ms) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for run in sorted(admitted, key=lambda r: (run_label(r), r["streams"])):
            listening = run.get("listening_mean")
            refusal = " / ".join(
                fmt(run.get(k), ".1f") for k in ("reject_latency_p50_ms", "reject_latency_p99_ms")
            )
            lines.append(
                f"| {run_label(run)} | {run['streams'] / capacity:.2f} "
                f"| {fmt(None if listening is None else listening / capacity, '.2f')} "
                f"| {run['xrt'] / capacity:.2f} | {run['rejected']} | {refusal} "
                f"| {fmt(run.get('wait_p99_ms'))} |"
            )
    lines.append("")
    lines.append(
        "Stall-free capacity (largest N with >= 99% stall-free streams and TTFA p99 <= 1 s):"
    )
    lines.append("")
    for label, n in stall_free_capacity(runs).items():
        served = [
            r.get("listening_mean")
            for r in runs
            if run_label(r) == label and r["streams"] == n and r.get("listening_mean")
        ]
        line = f"- {label}: N = {n:g} ({n / capacity:.2f} C)"
        if served and n > 0:
            line += f"; {served[0]:.1f} listeners served there ({served[0] / capacity:.2f} C)"
        lines.append(line)
    lines += [
        "",
        "Notes: N listeners in a closed loop (each sends its next request when it has heard "
        "the last one) play their streams through a 1x player that resets on a stall. "
        "Stall ratio = total stall / total audio (every stall "
        "counted); the bound is max(0, N/C - 1). Stall-free ignores stalls under "
        f"{STALL_TOLERANCE_S * 1000:.0f} ms; an interruption is a stall >= "
        f"{INTERRUPTION_S * 1000:.0f} ms. Listening = time-averaged number of players "
        "between first audio and end of playback (stalls included; a client waiting for its "
        "first audio or for a Retry-After is not listening). With admission, figures are over "
        "accepted streams (rejected clients wait Retry-After and retry). xRT = audio seconds "
        "received per wall second.",
    ]
    return "\n".join(lines) + "\n"


def pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdf(ax: Any, samples: Iterable[float], label: str) -> None:
    """The empirical CDF of `samples` as a step line (nothing without samples)."""
    xs = sorted(samples)
    if xs:
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=label)


def save_figure(fig: Any, path: Path, axes: Iterable[Any] = (), legend_fontsize: int = 8) -> None:
    """A grid and the legend on each of `axes`, then `fig` to `path` (100 dpi), closed."""
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=legend_fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def plot_ttfa_cdf(results: Mapping[str, Any], path: Path) -> None:
    """One panel per N, one TTFA CDF per policy."""
    plt = pyplot()
    runs = [r for r in results["runs"] if r.get("ttfa_ms")]
    ns = sorted({r["streams"] for r in runs})
    if not ns:
        return
    fig, axes = plt.subplots(1, len(ns), figsize=(3.2 * len(ns), 3.2), sharey=True, squeeze=False)
    capacity = float(results["capacity_audio_s_per_s"])
    for ax, n in zip(axes[0], ns, strict=True):
        for label in labels_in_order(runs):
            for run in runs:
                if run["streams"] == n and run_label(run) == label:
                    plot_cdf(ax, run["ttfa_ms"], label)
        ax.axvline(TTFA_P99_LIMIT_MS, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"N = {n} ({n / capacity:.2f} C)")
        ax.set_xlabel("TTFA (ms)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("share of streams")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def _plot_by_label(
    results: Mapping[str, Any], field: str, scale: float = 1.0
) -> tuple[Any, Any, float]:
    """A figure with `field` (times `scale`) against N, one line per label: (fig, ax, C)."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    runs = results["runs"]
    for i, label in enumerate(labels_in_order(runs)):
        points = sorted((r["streams"], r[field]) for r in runs if run_label(r) == label)
        ax.plot(
            [n for n, _ in points],
            [scale * y for _, y in points],
            marker=MARKERS[i % len(MARKERS)],
            alpha=0.85,
            label=label,
        )
    return fig, ax, float(results["capacity_audio_s_per_s"])


def plot_stall_ratio(results: Mapping[str, Any], path: Path) -> None:
    """Stall ratio against N, with the bound max(0, N/C - 1)."""
    fig, ax, capacity = _plot_by_label(results, "stall_ratio")
    top = max(r["streams"] for r in results["runs"]) * 1.05
    grid = [top * i / 200 for i in range(201)]
    ax.plot(
        grid, [stall_ratio_bound(n, capacity) for n in grid], "k--", label="bound max(0, N/C-1)"
    )
    ax.axvline(capacity, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("listeners N (closed loop)")
    ax.set_ylabel("stall ratio (stall s / audio s)")
    ax.set_title(f"Stall ratio vs N (C = {capacity:.2f})")
    save_figure(fig, path, [ax])


def plot_stall_free(results: Mapping[str, Any], path: Path) -> None:
    fig, ax, capacity = _plot_by_label(results, "stall_free_share", scale=100.0)
    ax.axhline(100 * STALL_FREE_SHARE, color="grey", linestyle=":", linewidth=1)
    ax.axvline(capacity, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("listeners N (closed loop)")
    ax.set_ylabel(f"stall-free streams (%; stalls < {STALL_TOLERANCE_S * 1000:.0f} ms ignored)")
    ax.set_ylim(-2, 102)
    ax.set_title("Stall-free share vs N")
    save_figure(fig, path, [ax])


PLOTS = {
    "ttfa_cdf.png": plot_ttfa_cdf,
    "stall_ratio.png": plot_stall_ratio,
    "stall_free.png": plot_stall_free,
}


def write_results_json(results: Mapping[str, Any], out_dir: Path) -> Path:
    """out_dir/results.json (out_dir created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return path


def write_report(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """results.json, table.md and the plots into `out_dir`; returns the paths written."""
    written = [write_results_json(results, out_dir), out_dir / "table.md"]
    written[1].write_text(markdown_table(results), encoding="utf-8")
    for name, plot in PLOTS.items():
        plot(results, out_dir / name)
        if (out_dir / name).exists():
            written.append(out_dir / name)
    return written


def publish_latest(out_dir: Path, results_root: Path, prefix: str = "latest") -> None:
    """Copy a run to results_root/<prefix>.json and results_root/<prefix>/ (table + plots),
    the committed copy the README links to."""
    latest_dir = results_root / prefix
    if latest_dir.exists():
        shutil.rmtree(latest_dir)
    latest_dir.mkdir(parents=True)
    shutil.copyfile(out_dir / "results.json", results_root / f"{prefix}.json")
    for path in out_dir.iterdir():
        if path.suffix in (".md", ".png"):
            shutil.copyfile(path, latest_dir / path.name)


def redraw_args(argv: Sequence[str] | None, description: str | None) -> tuple[Any, Path]:
    """`results.json [out_dir]` from the command line: the results, and where to write
    (out_dir, or the folder of results.json)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("results", type=Path)
    parser.add_argument("out_dir", type=Path, nargs="?")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text(encoding="utf-8"))
    return results, args.out_dir or args.results.parent


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.report results.json [out_dir]`: redraw a report."""
    for path in write_report(*redraw_args(argv, main.__doc__)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
