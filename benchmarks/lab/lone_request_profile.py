"""Where a lone short request's time goes, call by call (issue #55).

    python -m benchmarks.lab.lone_request_profile [--rounds 3] [--set section.field=value ...]

One engine on the default voice (configs/default.yaml with `backend.kind=piper`, the
default voice's backend alone, whose calls it times, plus --set; no calibration, no
admission), in this process. Each text of `benchmarks.lab.rtf_ab.SHORT_TEXTS` is sent alone,
read as fast as possible, `--settle` s of quiet after it; the last round is printed: every
backend call (phonemiser, encoder, each flow step with the frames it made, each vocoder
call with the frames it decoded and those it emitted) with its start and end from the
submit and its thread, then when each chunk reached the reader. The frames decoded beyond
those emitted are the context; flow frames beyond the segment's are the flow's context.
The calls are timed by wrapping the Piper backend's own methods (no other change); the
HTTP and encoder cost of a request is what `python -m benchmarks.lab.rtf_ab --texts short`
measures beyond this.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from app.settings import load_settings
from benchmarks.lab.rtf_ab import SHORT_TEXTS
from benchmarks.voice import CONFIG
from pipeline import Engine
from pipeline.backends import build_backend

Call = tuple[float, float, str, str, str]  # start, end, thread, what, detail


def _wrap(obj: object, name: str, what: str, calls: list[Call], detail: Callable[..., str]) -> None:
    method = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = method(*args, **kwargs)
        end = time.perf_counter()
        thread = threading.current_thread().name
        calls.append((start, end, thread, what, detail(args, result)))
        return result

    setattr(obj, name, timed)


def _vocode_detail(args: tuple[Any, ...], _: object) -> str:
    return ", ".join(
        f"{len(i.frames)} decoded, {i.emit_frames} emitted (after {i.emit_offset_frames})"
        for i in args[0]
    )


async def _run(args: argparse.Namespace) -> None:
    settings = load_settings(
        CONFIG,
        ["backend.kind=piper", "engine.calibration_calls=0", "admission.enabled=false", *args.set],
    )
    s = settings
    backend = build_backend(s.backend, s.backend_config(), talker=s.talker, vocoder=s.vocoder)
    voice = backend.voices()[0]
    calls: list[Call] = []
    _wrap(backend, "open_segment", "open", calls, lambda a, _: f"urgent={a[0].urgent}")
    _wrap(backend, "_encode", "encoder", calls, lambda a, r: f"{r[0].shape[2]} frames")
    _wrap(backend, "_flow", "flow", calls, lambda a, _: f"[{a[3]}, {a[4]}) of {a[1].shape[2]}")
    _wrap(backend, "_vocode", "vocoder", calls, _vocode_detail)
    engine = Engine(
        backend,
        scheduling=s.scheduling,
        chunking=s.chunking,
        admission=s.admission,
        engine=s.engine,
        talker=s.talker,
        text=s.text,
        vocoder=s.vocoder,
        alone=s.alone,
    )
    await engine.start()
    try:
        for round_index in range(args.rounds):
            for text in SHORT_TEXTS:
                calls.clear()
                t0 = time.perf_counter()
                stream = engine.submit(text, voice=voice.id)
                chunks: list[tuple[float, int]] = []
                async for pcm in stream.chunks():
                    chunks.append((time.perf_counter() - t0, pcm.size))
                wall_s = time.perf_counter() - t0
                await asyncio.sleep(args.settle)
                if round_index < args.rounds - 1:
                    continue
                audio_s = sum(n for _, n in chunks) / voice.sample_rate_hz
                busy_s = sum(end - start for start, end, *_ in calls)
                print(
                    f"\n{text!r}: {audio_s:.2f} s of audio in {1000 * wall_s:.0f} ms "
                    f"(RTF {wall_s / audio_s:.3f}), first audio {1000 * chunks[0][0]:.0f} ms, "
                    f"{1000 * busy_s:.0f} ms in backend calls"
                )
                for start, end, thread, what, detail in sorted(calls):
                    print(
                        f"  {1000 * (start - t0):6.1f} -> {1000 * (end - t0):6.1f} ms "
                        f"({1000 * (end - start):5.1f}) {thread[:16]:16s} {what:8s} {detail}"
                    )
                print(
                    "  chunks read at: "
                    + ", ".join(
                        f"{1000 * at:.0f} ms ({1000 * n / voice.sample_rate_hz:.0f} ms audio)"
                        for at, n in chunks
                    )
                )
    finally:
        await engine.stop()
        backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lab.lone_request_profile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3, help="the last one is printed")
    parser.add_argument("--settle", type=float, default=0.2, help="quiet after each, s")
    parser.add_argument("--set", action="append", default=[], help="section.field=value")
    asyncio.run(_run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
