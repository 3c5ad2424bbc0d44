"""The backbone's KV cache: one tensor pair per layer, a slot (row) per open segment.

Each layer holds K and V as [slots + 1, kv_heads, max_tokens, head_dim]; a segment owns
one slot for its life and writes token t of its sequence at index t. The last slot is
scratch: padding rows of a batch write there. Slots are handed out lowest first, so the
live ones stay packed at the start (the fixed-shape step's rows are the slots
0..R-1). Freeing a slot makes it reusable at once (the memory stays allocated; `live`
counts the slots in use). When every slot is taken, a growable cache doubles (one copy);
a fixed one (its tensors captured in CUDA graphs) refuses the segment.
"""

from __future__ import annotations

import heapq

import torch


class SlotsFull(RuntimeError):
    """Every slot of a fixed-size cache is held by an open segment."""


class KVSlots:
    def __init__(
        self,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        max_tokens: int,
        slots: int,
        device: torch.device,
        dtype: torch.dtype,
        grow: bool = True,
    ) -> None:
        self.max_tokens = max_tokens
        self.grows = grow
        self._shape = (kv_heads, max_tokens, head_dim)
        self._layers = layers
        self._device = device
        self._dtype = dtype
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._capacity = 0
        self._free: list[int] = []  # a min-heap
        self._used: set[int] = set()
        self._grow(slots)

    @property
    def capacity(self) -> int:
        """Slots that segments can hold (the scratch slot not counted)."""
        return self._capacity

    @property
    def scratch(self) -> int:
        return self._capacity

    @property
    def live(self) -> int:
        """Slots held by open segments."""
        return len(self._used)

    def _grow(self, capacity: int) -> None:
        def grown(old: torch.Tensor | None) -> torch.Tensor:
            new = torch.zeros((capacity + 1, *self._shape), device=self._device, dtype=self._dtype)
            if old is not None:
                new[: self._capacity] = old[: self._capacity]
            return new

        if self.keys:
            self.keys = [grown(k) for k in self.keys]
            self.values = [grown(v) for v in self.values]
        else:
            self.keys = [grown(None) for _ in range(self._layers)]
            self.values = [grown(None) for _ in range(self._layers)]
        for slot in range(self._capacity, capacity):
            heapq.heappush(self._free, slot)
        self._capacity = capacity

    def allocate(self) -> int:
        if not self._free:
            if not self.grows:
                raise SlotsFull(
                    f"all {self._capacity} KV-cache slots are held by open segments "
                    "(codec_lm.max_rows)"
                )
            self._grow(self._capacity * 2)
        slot = heapq.heappop(self._free)
        self._used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot in self._used:
            self._used.remove(slot)
            heapq.heappush(self._free, slot)
