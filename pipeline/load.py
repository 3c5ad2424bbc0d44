"""One measure of load, read by every decision that depends on how busy the engine is.

A stage core builds it once per turn (`StreamTable.load()`) and hands it to what it
decides in that turn. The one definition of a stream being alone lives here: a stream is
alone when no other stream has work left; a job's segment stream (Engine.submit_job) is
such a stream too: its work takes the same cores (docs/jobs.md). What the engine does
differently then (see
docs/architecture.md, "A stream alone"):

- the vocoder's workers decode a lone stream's next chunks side by side (work-ahead),
  and its last frames are cut evenly over them (the even tail);
- the talker has the backend prepare its next sentence while it steps the current one;
- its next segment is urgent only below `alone.urgent_slack_s` of audio ahead;
- the talker runs ahead of it beside a busy vocoder (all its work is due, none is another
  stream's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Load:
    """How many streams have work left (talker or vocoder work, their audio not all sent;
    a live-text stream that sent all it had and waits for its client's next text has
    none until that text comes)."""

    working: int

    @property
    def alone(self) -> bool:
        """At most one stream has work: the machine is its own."""
        return self.working <= 1


@dataclass(frozen=True, slots=True)
class UrgentSlack:
    """Below how much audio ahead of its player a stream is urgent, to the talker (its
    segment's small first step, its place on the second lane) and to the vocoder (its
    chunk waits for no lookahead): `shared_s` (`talker.urgent_slack_s`), or `alone_s`
    for a stream alone (`alone.urgent_slack_s`; None: the same)."""

    shared_s: float = math.inf
    alone_s: float | None = None

    def limit_s(self, load: Load) -> float:
        return self.alone_s if load.alone and self.alone_s is not None else self.shared_s


# no limit: every stream urgent (the cores' default where no config says otherwise)
ALWAYS_URGENT = UrgentSlack()
