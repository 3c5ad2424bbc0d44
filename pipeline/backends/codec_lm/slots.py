"""The backbone's KV cache: one tensor pair per layer, a slot (row) per open segment.

Each layer holds K and V as [slots + 1, kv_heads, max_tokens, head_dim]; a segment owns
one slot for its life and writes token t of its sequence at index t. The last slot is
scratch: padding rows of a batch write there. Freeing a slot makes it reusable at once
(the memory stays allocated; `live` counts the slots in use). When every slot is taken,
the cache grows to twice the slots (one copy).
"""

from __future__ import annotations

import torch


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
    ) -> None:
        self.max_tokens = max_tokens
        self._shape = (kv_heads, max_tokens, head_dim)
        self._layers = layers
        self._device = device
        self._dtype = dtype
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._capacity = 0
        self._free: list[int] = []
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
        self._free.extend(range(capacity - 1, self._capacity - 1, -1))
        self._capacity = capacity

    def allocate(self) -> int:
        if not self._free:
            self._grow(self._capacity * 2)
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot in self._used:
            self._used.remove(slot)
            self._free.append(slot)
