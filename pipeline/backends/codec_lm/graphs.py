"""One step function, run eagerly or replayed from a CUDA graph captured per shape bucket.

A step function reads its inputs from persistent tensors and writes its outputs into
persistent tensors (it returns nothing), so calling it and replaying a graph of it are the
same thing. On a CPU (or with graphs off) `run` calls it: the tests run the very code that
a GPU captures. On CUDA `capture` records it once per key (a row bucket, a key bucket ...),
after two warm-up calls on a side stream, into one memory pool that all graphs share (they
never run at once: one stream, one step at a time); `run` replays it. Capture belongs to
start-up: a key first met while serving runs eagerly and is counted (`late_keys`), never
captured mid-stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

import torch

logger = logging.getLogger("playhead.codec_lm")


class StepGraphs:
    def __init__(self, name: str, device: torch.device, enabled: bool, stream=None) -> None:
        self.name = name
        self.enabled = enabled and device.type == "cuda"
        self.stream = stream  # the CUDA stream the graphs replay on (None: the current one)
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self.capture_s = 0.0
        self.late_keys: set[Hashable] = set()
        self.failed: dict[Hashable, str] = {}
        self.replay = True  # False: run eagerly even where a graph exists (checks)

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def capture(self, key: Hashable, fn: Callable[[], None]) -> bool:
        """Warm up and capture `fn` under `key` (CUDA only); False when it cannot be."""
        if not self.enabled or key in self._graphs:
            return key in self._graphs
        started = time.perf_counter()
        current = self.stream or torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        try:
            with torch.cuda.stream(side):
                for _ in range(2):  # allocations, autotuning, lazy inits outside the capture
                    fn()
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(current), torch.cuda.graph(graph, pool=self._pool):
                fn()
        except Exception as error:  # a shape that cannot be captured runs eagerly
            current.wait_stream(side)
            self.failed[key] = f"{type(error).__name__}: {error}"
            logger.warning("%s: no CUDA graph for %s (%s); it runs eagerly", self.name, key, error)
            return False
        finally:
            self.capture_s += time.perf_counter() - started
        self._pool = graph.pool()
        self._graphs[key] = graph
        return True

    def run(self, key: Hashable, fn: Callable[[], None]) -> None:
        graph = self._graphs.get(key) if self.replay else None
        if graph is not None:
            graph.replay()
            return
        if self.enabled and self.replay and key not in self.failed and key not in self.late_keys:
            # not captured at start-up: runs eagerly, never captured while streams play
            self.late_keys.add(key)
            logger.warning("%s: shape %s has no start-up graph; it runs eagerly", self.name, key)
        fn()
