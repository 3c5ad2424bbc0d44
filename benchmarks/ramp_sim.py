"""Which first chunks (`chunking.ramp`) a codec LM can keep up with, on the sim backend:

    python -m benchmarks.ramp_sim --step-ms 27 35 49 --streams 64 256 --ramps 2,4 2,3,5

The real Engine, in real time, on the sim backend shaped like the codec LM on a GPU: one
frame per stream per talker step, a step of `--step-ms` whatever the batch (as measured on
an H200: 27 ms at batch 64, 35 at 256 alone, 49-54 while serving with prefills), and
Mimi's batched call (2 ms + 0.013 ms a frame, from the same run). N clients loop over the
corpus, arriving over the first 5 s, each played by benchmarks/gpu_check.py's 1x player;
per (step, N, ramp) it prints the stall-free share, TTFA p50/p99 and where in the audio
the stalls fell.

Why: a stream is made at (80 ms / step) times real time, and chunk i+1 must be made while
chunks 1..i play, so a ramp can only be as steep as that rate allows (docs/codec-lm.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses

from benchmarks.gpu_check import ROOT, corpus, engine_run, load_sections
from pipeline.backends.sim import SimBackend
from pipeline.config import SimConfig
from scheduling import AdmissionConfig


async def _run(sections, step_ms: float, streams: int, ramp: tuple[int, ...], seconds: float):
    from pipeline.engine import Engine

    backend = SimBackend(
        SimConfig(
            talker_frames_per_step=1,
            talker_step_base_ms=step_ms,
            talker_step_per_stream_ms=0.0,
            vocoder_base_ms=2.0,
            vocoder_per_frame_ms=0.013,
        )
    )
    engine = Engine(
        backend,
        scheduling=sections["scheduling"],
        chunking=dataclasses.replace(sections["chunking"], ramp=ramp),
        admission=AdmissionConfig(enabled=False),
        engine=sections["engine"],
        talker=dataclasses.replace(sections["talker"], batch=max(streams, 1)),
        text=sections["text"],
    )
    await engine.start()
    try:
        return await engine_run(engine, streams, seconds, min(5.0, seconds / 3), corpus())
    finally:
        await engine.stop()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, nargs="+", default=[27.0, 35.0, 49.0])
    parser.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--ramps", nargs="+", default=["2,4", "2,3,5"])
    parser.add_argument("--seconds", type=float, default=15.0, help="each run")
    parser.add_argument("--config", default=str(ROOT / "configs" / "codec-lm-1b-random.yaml"))
    args = parser.parse_args(argv)
    sections = load_sections(ROOT / args.config, ["engine.calibration_calls=0"])
    rows = []
    print(
        f"{'step ms':>7} {'N':>4} {'ramp':>10} {'stall-free':>10} {'TTFA p50/p99 ms':>16}  stalls"
    )
    for step_ms in args.step_ms:
        for streams in args.streams:
            for text in args.ramps:
                ramp = tuple(int(x) for x in text.split(",") if x)
                row = asyncio.run(_run(sections, step_ms, streams, ramp, args.seconds))
                row.update(step_ms=step_ms, streams=streams, ramp=list(ramp))
                rows.append(row)
                places = row["stall_places"]
                print(
                    f"{step_ms:7.0f} {streams:4d} {list(ramp)!s:>10} "
                    f"{row['stall_free']:10.0%} "
                    f"{row['ttfa_p50_s'] * 1e3:7.0f}/{row['ttfa_p99_s'] * 1e3:.0f}  "
                    f"{places['stalls']} ({places['in_first_0_5_s']} in the first 0.5 s, "
                    f"median at {places['audio_at_p50_s']} s, {places['stall_ms_p50']} ms)",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
