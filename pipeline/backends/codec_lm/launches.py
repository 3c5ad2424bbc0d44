"""The host side of the fixed-shape step: which rows run, the buffers they read, and the
frames coming back without a host sync per step.

`launch` picks the work among the segments given (decode: one frame each for those past
their prompt; prefill: the next chunk of up to `prefill_rows` prompts, in the order
given), writes the positions, slots and token ids into the step's buffers (on CUDA through
pinned staging buffers, copied without blocking), launches the prefill step, then the
decode step (which also makes the first frame of each prompt that prefill ended), and
queues the copy of the frames into pinned host memory behind them, with an event.
`collect` waits for a launch's event and hands each frame to its segment. With
`overlap` the backend collects step n after it has launched step n+1, so the GPU works on
the next step while the host hands out frames and the engine plans; a segment's frames
then come one step call late, and a segment whose last frame is in flight answers its next
step with that frame and `done` (nothing is launched for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.backends.codec_lm.fixed import FixedStep


@dataclass(eq=False)
class SlotSegment:
    """One open text segment in the fixed-shape stepper."""

    prompt: list[int]
    max_frames: int
    slot: int
    seed: int = 0  # the sampling noise's seed (sampling.segment_seed)
    prefilled: int = 0  # prompt tokens in the cache
    launched: int = 0  # frames launched (the first comes with the prompt's last chunk)
    delivered: int = 0  # frames handed back by step()
    pending: list[np.ndarray] = field(default_factory=list)  # collected, not yet handed back
    ended: bool = False  # an end frame was seen
    done: bool = False
    closed: bool = False

    @property
    def in_prompt(self) -> bool:
        return self.prefilled < len(self.prompt)

    @property
    def next_position(self) -> int:
        """Where the next decode feeds its last frame (and draws its noise)."""
        return len(self.prompt) + self.launched - 1


@dataclass
class Launch:
    entries: list[SlotSegment]  # the segments given a frame (each at its slot's row)
    output: torch.Tensor | None  # the frames, [rows, codebooks], host side (None: none)
    event: object | None  # a CUDA event recorded after the copy (None on a CPU)
    prefill: int = 0  # prompts that ran a chunk of prefill


class _Staging:
    """Host buffers for small uploads (pinned on CUDA), reused round robin once the copy
    that last read one has run."""

    def __init__(self, device: torch.device, count: int = 16) -> None:
        self.cuda = device.type == "cuda"
        self._ring: list[tuple[torch.Tensor, object | None]] = []
        self._count = count
        self._next = 0
        self._size = 0

    def upload(self, dst: torch.Tensor, values: np.ndarray) -> None:
        src = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).reshape(dst.shape)
        if not self.cuda:
            dst.copy_(src)
            return
        n = src.numel()
        if n > self._size:
            self._size = max(n, 2 * self._size)
            self._ring = [
                (torch.empty(self._size, dtype=torch.long).pin_memory(), None)
                for _ in range(self._count)
            ]
        host, event = self._ring[self._next]
        if event is not None:
            event.synchronize()  # long done: the ring holds several steps
        host[:n].copy_(src.reshape(-1))
        dst.copy_(host[:n].view(dst.shape), non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._ring[self._next] = (host, done)
        self._next = (self._next + 1) % self._count


class Launcher:
    def __init__(self, step: FixedStep, prefill_rows: int) -> None:
        self.step = step
        self.prefill_rows = prefill_rows
        self.cuda = step.device.type == "cuda"
        self._staging = _Staging(step.device)
        self.shapes: set[tuple[str, int, int]] = set()  # (kind, rows, keys) launched so far
        self._outputs: list[torch.Tensor] = []
        self._next_output = 0

    def _host_output(self) -> torch.Tensor:
        """Pinned host buffers for a launch's frames: three, round robin (at most two
        launches are uncollected at once)."""
        shape = tuple(self.step.frames.shape)
        if not self._outputs or tuple(self._outputs[0].shape) != shape:
            self._outputs = [
                torch.empty(shape, dtype=torch.long, pin_memory=self.cuda) for _ in range(3)
            ]
        out = self._outputs[self._next_output]
        self._next_output = (self._next_output + 1) % len(self._outputs)
        return out

    def launch(self, segments: list[SlotSegment]) -> Launch | None:
        step = self.step
        step.ensure_capacity()
        decode = [s for s in segments if not s.in_prompt and not s.ended]
        decode = [s for s in decode if s.launched < s.max_frames]
        prefill = [s for s in segments if s.in_prompt][: self.prefill_rows]
        if not decode and not prefill:
            return None
        finals: list[SlotSegment] = []  # prompts that end in this step's prefill
        if prefill:  # first: the decode after it makes their first frames
            rows = step.prefill_bucket(len(prefill))
            slots = np.full(rows, step.cache.scratch, dtype=np.int64)
            ids = np.zeros((rows, step.chunk), dtype=np.int64)
            starts = np.zeros(rows, dtype=np.int64)
            lengths = np.ones(rows, dtype=np.int64)
            final = np.zeros(rows, dtype=np.int64)
            for row, s in enumerate(prefill):
                piece = s.prompt[s.prefilled : s.prefilled + step.chunk]
                slots[row], starts[row], lengths[row] = s.slot, s.prefilled, len(piece)
                ids[row, : len(piece)] = piece
                final[row] = s.prefilled + len(piece) == len(s.prompt)
            keys = step.key_bucket(int((starts + lengths).max()))
            self._staging.upload(step.pf_slots[:rows], slots)
            self._staging.upload(step.pf_ids[:rows], ids)
            self._staging.upload(step.pf_start[:rows], starts)
            self._staging.upload(step.pf_len[:rows], lengths)
            self._staging.upload(step.pf_final[:rows], final)
            step.prefill(rows, keys)
            self.shapes.add(("prefill", rows, keys))
            for row, s in enumerate(prefill):
                s.prefilled += int(lengths[row])
                if final[row]:
                    finals.append(s)
        entries = [*decode, *finals]
        if not entries:  # prefill chunks only: no frame this step
            return Launch([], None, self._event(), len(prefill))
        rows = step.row_bucket(max(s.slot for s in entries) + 1)
        positions = np.full(rows, step.trash, dtype=np.int64)
        for s in decode:
            positions[s.slot] = s.next_position
        talking = positions[positions < step.trash]
        keys = step.key_bucket(int(talking.max()) + 1 if len(talking) else 1)
        self._staging.upload(step.positions[:rows], positions)
        step.decode(rows, keys)
        self.shapes.add(("decode", rows, keys))
        host = self._host_output()
        host[:rows].copy_(step.frames[:rows], non_blocking=self.cuda)
        for s in entries:
            s.launched += 1
        return Launch(entries, host, self._event(), len(prefill))

    def _event(self) -> object | None:
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def collect(self, launch: Launch | None) -> None:
        if launch is None:
            return
        if launch.event is not None:
            launch.event.synchronize()
        if launch.output is None:
            return
        frames = launch.output.numpy()
        for segment in launch.entries:
            if not segment.closed:
                segment.pending.append(frames[segment.slot].copy())
