"""What a second of each voice's audio costs the machine, against the reference voice.

One server may serve backends of very different costs (Piper ~0.04 s of CPU per audio
second, Kokoro ~0.4). The capacity C is read in streams of the REFERENCE voice (the
default voice's backend), and a stream of another backend counts `cost` of them: its
backend's machine seconds per audio second over the reference's, from the calibration,
which measures every backend's capacity alone (Engine.calibrate). So admission sums the
work owed in machine time (StreamLoad.cost, LoadView.new_stream_cost), and the capacity
in streams of a backend is C / its cost. EDF is unchanged: deadlines are deadlines.

A backend's voices share its cost (`group` names the backend). Before a calibration
measured both, every cost is 1 (as a one-backend server's always is). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


class VoiceCosts:
    """Each voice's backend (`groups`: voice id -> backend name) and each backend's cost
    relative to the `reference` backend's."""

    def __init__(self, groups: Mapping[str, str], reference: str) -> None:
        if reference not in set(groups.values()):
            raise ValueError(f"reference backend {reference!r} serves no voice")
        self._groups = dict(groups)
        self.reference = reference
        self._costs = {group: 1.0 for group in groups.values()}

    @property
    def groups(self) -> list[str]:
        """The backends, the reference last (the calibration runs it last: its run is
        the one the capacity model keeps)."""
        others = [g for g in dict.fromkeys(self._groups.values()) if g != self.reference]
        return [*others, self.reference]

    def group_of(self, voice_id: str) -> str:
        return self._groups.get(voice_id, self.reference)

    def cost(self, voice_id: str) -> float:
        """The voice's machine seconds per audio second over the reference's (1.0 for an
        unknown voice: it is refused elsewhere)."""
        return self._costs[self.group_of(voice_id)]

    def group_cost(self, group: str) -> float:
        return self._costs[group]

    @property
    def most(self) -> float:
        """The dearest backend's cost (a request whose voice is not known yet)."""
        return max(self._costs.values())

    def set_capacities(self, capacities: Mapping[str, float]) -> None:
        """Each backend's capacity measured alone (audio s per s): its cost is the
        reference's capacity over its own. A backend not measured (or 0) keeps its cost;
        nothing changes without the reference's."""
        reference = capacities.get(self.reference, 0.0)
        if not (math.isfinite(reference) and reference > 0):
            return
        for group, capacity in capacities.items():
            if group in self._costs and math.isfinite(capacity) and capacity > 0:
                self._costs[group] = reference / capacity

    def capacities(self, reference_capacity: float) -> dict[str, float]:
        """Streams at 1x of each backend alone, from the capacity in reference streams."""
        return {group: reference_capacity / cost for group, cost in self._costs.items()}
