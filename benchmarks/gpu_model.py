"""The engine on the H200's measured costs, without a GPU:

    python -m benchmarks.gpu_model --out DIR [--seconds 15] [--real-seconds 15]

The Engine as served, on the gpu_model backend (pipeline/backends/gpu_model.py: the
codec-LM backend's steps and Mimi turns at a cost table's times), with gpu_check's load:
N clients looping over the corpus, arriving over the first 5 s, each played by a 1x
player, admission off (as gpu_check). It writes DIR/gpu-model.json and prints:

1. reproduction: each GPU run's engine table (benchmarks/results/gpu-check-*.json) beside
   the model's prediction of it, on the engine settings of that run's code (ramp [2, 4])
   and that run's own measured costs: the 14:53 run's table as shipped
   (configs/gpu-costs/h200-20261204-1453.yaml, read from its JSON, nothing fitted), the
   14:39 run's read from its JSON the same way (not refitted), on a virtual clock;
2. the engine as configured for the GPU (configs/codec-lm-1b-random.yaml) on the costs of
   the code as it is now (--table, the backbone-only prefill's cell derived), at N = 1,
   64, 128, 256, on a virtual clock and in real time (this machine's clock: the engine's
   own CPU time counts, shared with whatever else runs here), for the byte tokenizer's
   prompts (`real_time`, `virtual_time`) and CSM's (4 characters a token, `*_csm_prompts`);
3. the ramp A/B (the ramp before and the one kept) at N = 256 by the prefill's cost;
4. as served: the clients through admission, as the API's (`as_served`).

Virtual time (benchmarks/virtual_time.py) makes the same decisions every run whatever
else the machine does; real time shows the engine's own host work on top.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_check import ROOT, admission_config, load_sections, run_point
from pipeline.backends.gpu_costs import GpuCostTable, load_cost_table, table_from_dict

MEASURED = ROOT / "configs" / "gpu-costs" / "h200-20261204-1453.yaml"  # the 048f89d code's
TABLE = ROOT / "configs" / "gpu-costs" / "h200-20261204-1453-backbone-prefill.yaml"  # today's
DESIGN = ROOT / "configs" / "codec-lm-1b-random.yaml"  # the engine as served on the GPU
RESULTS = ROOT / "benchmarks" / "results"
STREAMS = (1, 64, 128, 256)
# the runs reproduced: (label, its JSON, the engine settings of its code)
RUNS = (
    ("14:53", RESULTS / "gpu-check-20261204-145831.json", ["chunking.ramp=[2, 4]"]),
    ("14:39", RESULTS / "gpu-check-20261204-144423.json", ["chunking.ramp=[2, 4]"]),
)
# the ramp A/B: the ramp before and the one kept, at these prefill costs (ms a step carrying
# 64 tokens: today's derived 2.4, and dearer, should the GPU measure it so)
AB_RAMPS = ((2, 3, 5), (2, 2, 3, 4, 6))
AB_PREFILL_MS = (2.4, 12.0, 16.0, 20.0)
BOUNDS = {"stall_free": 0.10, "ttfa_p50_s": 0.25, "step_ms_p50": 0.15}


def table_from_run(path: Path, fitted: GpuCostTable) -> GpuCostTable:
    """A GPU run's costs as a table: its measured step, prefill step and Mimi turns; the
    constants it does not measure (host time, prefill per token) from `fitted`."""
    run = json.loads(path.read_text())
    if "cost_table" in run:  # recorded by gpu_check itself since 2026-12-05
        return table_from_dict(run["cost_table"])
    steps = {int(b): ms for b, ms in run["step_ms"].items()}
    rows = {b: max(fitted.row_multiple, b) for b in steps}
    decode_keys = sorted({k for _, k in fitted.decode_ms})[0]
    return dataclasses.replace(
        fitted,
        name=path.stem,
        source=f"{path.name}; host and per-token constants of {fitted.name}",
        decode_ms={(rows[b], decode_keys): ms for b, ms in steps.items()},
        prefill_ms={64: round(run["step_with_arrival_ms"] - steps[64], 2)},
        mimi_turn_ms={(int(k), 16): round(ms, 2) for k, ms in run["vocoder_turn_ms"].items()},
    )


def _line(label: str, row: dict[str, Any]) -> str:
    p50, p99 = row["ttfa_p50_s"] or 0.0, row["ttfa_p99_s"] or 0.0
    steps, places = row.get("talker_steps", {}), row["stall_places"]
    return (
        f"{label:>14} {row['stall_free']:6.0%} {p50 * 1e3:7.0f} {p99 * 1e3:7.0f} "
        f"{steps.get('ms_p50', float('nan')):7.1f} {steps.get('with_prefill', float('nan')):6.2f} "
        f"{steps.get('with_prompt_end', float('nan')):6.2f} "
        f"{places['stalls']:6d} {places['in_first_0_5_s']:6d} {places['audio_at_p50_s']!s:>6} "
        f"{_ms(row.get('margin_p1_s')):>7}"
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


HEADER = (
    f"{'':>14} {'free':>6} {'p50 ms':>7} {'p99 ms':>7} {'step ms':>7} {'w/ pf':>6} {'pf end':>6} "
    f"{'stalls':>6} {'<0.5s':>6} {'at s':>6} {'margin':>7}"
)


def _within(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, bool]:
    out = {"stall_free": abs(measured["stall_free"] - predicted["stall_free"]) <= 0.10}
    m, p = measured["ttfa_p50_s"], predicted["ttfa_p50_s"]
    out["ttfa_p50_s"] = m is not None and p is not None and abs(p - m) <= 0.25 * m
    if "talker_steps" in measured:
        m, p = measured["talker_steps"]["ms_p50"], predicted["talker_steps"]["ms_p50"]
        out["step_ms_p50"] = abs(p - m) <= 0.15 * m
    return out


def reproduce(fitted: GpuCostTable, seconds: float, streams=STREAMS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, path, settings in RUNS:
        run = json.loads(path.read_text())
        # the 14:53 run's own table is the one shipped (read from the same JSON)
        table = fitted if label == "14:53" else table_from_run(path, fitted)
        sections = load_sections(DESIGN, ["engine.calibration_calls=0", *settings])
        print(f"\n== {label} ({path.name}), ramp {list(sections['chunking'].ramp)} ==")
        print(HEADER)
        rows = {}
        for n in streams:
            measured = run["engine"].get(str(n))
            if measured is None:
                continue
            predicted = run_point("virtual_time", table, sections, n, seconds)
            within = _within(measured, predicted)
            rows[n] = {"measured": measured, "predicted": predicted, "within": within}
            if "talker_steps" in measured:  # its `with_prefill` counted prompts ending
                steps = measured["talker_steps"]
                measured = {
                    **measured,
                    "talker_steps": {
                        "ms_p50": steps["ms_p50"],
                        "with_prompt_end": steps["with_prefill"],
                    },
                }
            if "stall_places" not in measured:  # the 14:39 run recorded no stall places
                measured = {
                    **measured,
                    "stall_places": predicted["stall_places"]
                    | {"stalls": -1, "in_first_0_5_s": -1, "audio_at_p50_s": "-"},
                }
            print(_line(f"N={n} measured", measured))
            print(_line("predicted", predicted), " within bounds:", within, flush=True)
        out[label] = {"table": table.to_dict(), "streams": rows}
    return out


def ab_ramps(table: GpuCostTable, sections, seconds: float, streams: int = 256) -> list:
    """The ramp A/B at N streams on a virtual clock, at each prefill cost of AB_PREFILL_MS."""
    print(f"\n== A/B: the ramp, N = {streams}, by the prefill's cost (virtual time) ==")
    print(f"{'prefill ms':>10} {'ramp':>16}  " + HEADER.strip())
    rows = []
    for prefill_ms in AB_PREFILL_MS:
        costs = dataclasses.replace(table, prefill_ms={64: prefill_ms})
        for ramp in AB_RAMPS:
            arm = dict(sections, chunking=dataclasses.replace(sections["chunking"], ramp=ramp))
            row = run_point("virtual_time", costs, arm, streams, seconds)
            rows.append({"prefill_ms": prefill_ms, "ramp": list(ramp), **row})
            print(f"{prefill_ms:10.1f} {list(ramp)!s:>16}  " + _line("", row).strip(), flush=True)
    return rows


def as_served(table: GpuCostTable, config: Path, seconds: float, streams=STREAMS) -> dict:
    """The clients through admission as the API's (the config's admission section and
    start-up calibration), on a virtual clock."""
    sections = load_sections(config, [])
    admission = admission_config(config)
    print(f"\n== as served: through admission ({config.name}), virtual time ==")
    print(HEADER, " requests rejected")
    rows = {}
    for n in streams:
        row = run_point("virtual_time", table, sections, n, seconds, admission=admission)
        rows[n] = row
        print(_line(f"N={n}", row), f" {row['requests']} {row['rejected']}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table", type=Path, default=TABLE, help="the costs designed on")
    parser.add_argument("--config", type=Path, default=DESIGN, help="the engine as designed")
    parser.add_argument("--seconds", type=float, default=15.0, help="each virtual-time run")
    parser.add_argument("--real-seconds", type=float, default=15.0, help="each real-time run")
    parser.add_argument("--streams", type=int, nargs="+", default=list(STREAMS))
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["reproduce", "real_time", "ab", "as_served"]
    )
    parser.add_argument("--print-grid", action="store_true", help="the table's every bucket")
    args = parser.parse_args(argv)
    table = load_cost_table(args.table)
    figures: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "table": table.to_dict(),
        "config": str(args.config.relative_to(ROOT)),
    }
    if args.print_grid:
        print(json.dumps(table.grid(), indent=1))
    if "reproduce" not in args.skip:
        figures["reproduction"] = reproduce(load_cost_table(MEASURED), args.seconds)
    sections = load_sections(args.config, ["engine.calibration_calls=0"])
    for tokenizer, chars_per_token in (("byte", 1.0), ("csm", 4.0)):
        modes = ["virtual_time"] + ([] if "real_time" in args.skip else ["real_time"])
        for mode in modes:
            seconds = args.seconds if mode == "virtual_time" else args.real_seconds
            print(f"\n== {mode}, {tokenizer} prompts, {args.config.name}, {table.name} ==")
            print(HEADER)
            rows = {}
            for n in args.streams:
                row = run_point(mode, table, sections, n, seconds, chars_per_token)
                rows[n] = row
                print(_line(f"N={n}", row), f" ({row['wall_s']} s)", flush=True)
            key = mode if tokenizer == "byte" else f"{mode}_csm_prompts"
            figures[key] = rows
    if "ab" not in args.skip:
        figures["ab_ramp"] = ab_ramps(table, sections, args.seconds)
    if "as_served" not in args.skip:
        figures["as_served"] = as_served(table, args.config, args.seconds, args.streams)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-model.json").write_text(json.dumps(figures, indent=1, default=str))
    print(f"written: {args.out / 'gpu-model.json'}")
    return figures


if __name__ == "__main__":
    main()
