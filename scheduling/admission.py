"""Admission control: admit a new stream now, queue it briefly, or refuse it at once.

One pure policy for every protocol (HTTP, SSE, the WebSocket, the adapters) and for the
simulator; the engine's async front (pipeline/admission.py) only adds futures and timers.

What is counted is the work the server still OWES, not who is still listening: a stream
with audio left to produce costs 1 (it must be produced at 1 audio s per s at least), one
still in its start phase costs `1 + start_cost` (its first sentence through the talker and
its small ramp chunks cost more per audio second), and a stream whose audio is all
produced and sent costs nothing, whatever its player still has to play. A request fits
when the load with it is within `capacity x capacity_headroom` (capacity in audio s per
s, that is streams at 1x) and, with `max_streams` set, the streams with work are fewer.
An idle engine (no stream with work, none granted) takes one request whatever the capacity
reads: a low reading (the cores shared with another process, a slow voice) may leave no
room for a starting stream's `1 + start_cost`, and refusing on an idle machine would serve
nobody; the lone stream gets the whole machine.

A request that does not fit waits in ONE first-come-first-served queue when the model
predicts a slot within `queue_max_wait_s` (`predict_wait_s`: the owed audio drained by
processor sharing of the capacity); otherwise it is refused at once, with a Retry-After
from the same prediction. A waiter still queued after `queue_max_wait_s` (the prediction
was wrong) is refused then.

A wait in the queue counts toward the request's first audio. With `first_audio_bound_s`
set, a request waits at most that bound less the first audio the engine measures now
(`LoadView.first_audio_s`: how long its latest admitted streams took from submit to
first audio, scheduling/first_audio.py): one predicted to wait longer is refused at once
with its Retry-After rather than served after the bound, and a waiter is refused when
that time has passed (its deadline is set as it queues). Tickets are opaque to the policy
(the engine's reservations, the simulator's requests); the clock is passed in.

Voices of different costs (scheduling/voice_cost.py): the capacity is read in streams of
the reference voice (the default voice's backend), and every stream, granted ticket and
waiter counts `cost` times its units: its backend's machine seconds per audio second over
the reference's. So the load is summed in machine time, whatever the mix; with one
backend every cost is 1 and nothing changes.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from scheduling.validation import (
    check_bool,
    check_fraction,
    check_int,
    check_non_negative,
    require_finite_time,
)


@dataclass(frozen=True)
class AdmissionConfig:
    enabled: bool = True  # False: accept everything
    # streams with work left at most (0: only the capacity bounds them)
    max_streams: int = 0
    # share of the capacity model's reading that may be committed (the voice over
    # capacity: 1.0 stalled more and played no more than 0.95, 0.9 played less where the
    # model read low; docs/admission.md)
    capacity_headroom: float = 0.95
    # extra streams' worth a stream costs while in its start phase (its first
    # `start_phase_chunks` chunks, and until its talker made the frames of its first
    # steady chunk): streams that all start together overrun the stages although their
    # steady state fits
    start_cost: float = 3.0
    start_phase_chunks: int = 3
    # a request beyond capacity waits (first come first served) when a slot is predicted
    # within this long, and at most this long; else 429 at once. Kept well under the 5 s
    # after which voice-agent clients give up on a first audio.
    queue_max_wait_s: float = 1.0
    # the first audio a client may be kept waiting for, queue included (0: no bound): a
    # request waits at most this less the measured first audio (LoadView.first_audio_s)
    first_audio_bound_s: float = 1.0

    def __post_init__(self) -> None:
        check_bool("enabled", self.enabled)
        check_int("max_streams", self.max_streams, 0)
        check_fraction("capacity_headroom", self.capacity_headroom)
        check_non_negative("start_cost", self.start_cost)
        check_int("start_phase_chunks", self.start_phase_chunks, 1)
        check_non_negative("queue_max_wait_s", self.queue_max_wait_s)
        check_non_negative("first_audio_bound_s", self.first_audio_bound_s)


@dataclass(frozen=True, slots=True)
class StreamLoad:
    """One stream with work left, as admission sees it."""

    owed_audio_s: float  # audio still to produce (an estimate; inf: live text, open-ended)
    start_left_audio_s: float = 0.0  # audio left to produce in its start phase (0: past it)
    units: float = 1.0  # streams' worth of capacity it takes (a job: the rate promised it)
    # its voice's machine seconds per audio second, over the reference voice's (1: the
    # capacity's own voice; a Kokoro stream in a server whose C is Piper's: ~10)
    cost: float = 1.0


@dataclass(frozen=True, slots=True)
class LoadView:
    """What the policy reads at a decision: the capacity (audio s per s; <= 0 or NaN: not
    measured, only max_streams applies), the streams with work left, and the tickets
    granted but not yet streams (each costs a starting stream). For the prediction: the
    audio a new stream owes (its text is not read yet: a typical one's; inf: unknown)
    and its start phase's audio. `first_audio_s`: how long a stream admitted now is
    predicted to take from its submit to its first audio (measured; 0: not known).
    `granted_cost`: the granted tickets' costs summed (None: 1 each); `new_stream_cost`:
    the cost of the request being decided (its voice's; scheduling/voice_cost.py)."""

    capacity_audio_s_per_s: float
    streams: Sequence[StreamLoad] = ()
    granted: int = 0
    new_stream_audio_s: float = math.inf
    start_audio_s: float = 0.0
    first_audio_s: float = 0.0
    granted_cost: float | None = None
    new_stream_cost: float = 1.0


@dataclass(frozen=True, slots=True)
class Decision:
    accept: bool
    retry_after_s: int | None  # whole seconds >= 1 when refused; None otherwise
    # "ok", "disabled", "queued" (accept False, retry_after_s None: wait), "capacity",
    # "max_streams", "queue_timeout"
    reason: str
    wait_s: float | None = None  # "queued": the predicted wait

    @property
    def queued(self) -> bool:
        return self.reason == "queued"


_ACCEPT = Decision(True, None, "ok")
_ACCEPT_DISABLED = Decision(True, None, "disabled")


class Admission:
    """The policy and its queue (one per engine or simulated replica)."""

    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config
        self._queue: OrderedDict[Hashable, float] = OrderedDict()  # ticket -> deadline_s
        self._costs: dict[Hashable, float] = {}  # ticket -> its voice's cost (waiters)

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def __contains__(self, ticket: object) -> bool:
        return ticket in self._queue

    def load_units(self, view: LoadView) -> float:
        """Streams' worth of capacity committed: 1 per stream with work left, plus
        `start_cost` while it starts, and `1 + start_cost` per granted ticket, each times
        its cost (streams of the reference voice). The start's extra is the same for
        every voice: the reference's small ramp chunks' overhead (a Kokoro chunk is cut from
        its piece's one decode: no such overhead; counted x its cost, ~4 x 3.3 reference
        streams, a Kokoro start fitted only an idle Piper server)."""
        start = self._config.start_cost
        granted_cost = view.granted if view.granted_cost is None else view.granted_cost
        units = granted_cost + view.granted * start
        for stream in view.streams:
            units += stream.units * stream.cost + (start if stream.start_left_audio_s > 0 else 0.0)
        return units

    def fits(self, view: LoadView, ahead: int = 0, ahead_cost: float | None = None) -> bool:
        """Whether one more request (of `view.new_stream_cost`) fits after `ahead` others
        that wait before it (their costs summed: `ahead_cost`; None: the waiters')."""
        config = self._config
        if config.max_streams and len(view.streams) + view.granted + ahead >= config.max_streams:
            return False
        capacity = view.capacity_audio_s_per_s
        if not capacity > 0:
            return True
        load = self.load_units(view)
        if load == 0 and ahead == 0:  # an idle engine takes one, whatever the capacity
            return True
        if ahead_cost is None:
            ahead_cost = self._waiters_cost(ahead)
        need = ahead_cost + view.new_stream_cost + (ahead + 1) * config.start_cost
        return load + need <= capacity * config.capacity_headroom + 1e-9

    def _waiters_cost(self, count: int) -> float:
        """The first `count` waiters' costs summed (1 each past the queue: a prediction's)."""
        costs = [self._costs.get(ticket, 1.0) for ticket in list(self._queue)[:count]]
        return sum(costs) + max(0, count - len(costs))

    def free_slots(self, view: LoadView) -> float:
        """How many more requests would be admitted now, none waiting (math.inf: no limit
        applies: admission off, or neither a capacity nor max_streams)."""
        config = self._config
        if not config.enabled:
            return math.inf
        limits = []
        if config.max_streams:
            limits.append(config.max_streams - len(view.streams) - view.granted)
        capacity = view.capacity_audio_s_per_s
        if capacity > 0:
            load = self.load_units(view)
            room = capacity * config.capacity_headroom - load + 1e-9
            slots = math.floor(room / (view.new_stream_cost + config.start_cost))
            limits.append(max(slots, 1) if load == 0 else slots)  # idle: one, as in fits
        return float(max(0, min(limits) - self.waiting)) if limits else math.inf

    def offer(
        self, now_s: float, ticket: Hashable, view: LoadView, *, wait: bool = True
    ) -> Decision:
        """Decide a new request: accept now ("ok"; the caller then counts it granted),
        queue it ("queued", behind every earlier waiter) or refuse it with Retry-After.
        `wait=False` (a caller that cannot wait): accept or refuse only."""
        config = self._config
        if not config.enabled:
            return _ACCEPT_DISABLED
        require_finite_time("now_s", now_s)
        if not self._queue and self.fits(view):
            return _ACCEPT
        ahead = len(self._queue)
        wait_s = self.predict_wait_s(view, ahead)
        max_wait_s = self.max_wait_s(view)
        if wait and max_wait_s > 0 and wait_s <= max_wait_s:
            self._queue[ticket] = now_s + max_wait_s
            self._costs[ticket] = view.new_stream_cost
            return Decision(False, None, "queued", wait_s)
        return self._refusal(view, wait_s, ahead)

    def max_wait_s(self, view: LoadView) -> float:
        """How long a request queued now may wait: `queue_max_wait_s`, and with
        `first_audio_bound_s` at most that bound less the measured first audio (0 or
        less: it may not wait at all)."""
        config = self._config
        if not config.first_audio_bound_s:
            return config.queue_max_wait_s
        first_audio_s = view.first_audio_s if math.isfinite(view.first_audio_s) else math.inf
        return min(config.queue_max_wait_s, config.first_audio_bound_s - first_audio_s)

    def grant(self, view: LoadView) -> list[Hashable]:
        """The waiters that fit now, from the head of the queue, in order (removed from
        it; the caller counts them granted)."""
        granted: list[Hashable] = []
        granted_cost = 0.0
        queue = self._queue
        while queue:
            ticket = next(iter(queue))
            cost = self._costs.get(ticket, 1.0)
            head = replace(view, new_stream_cost=cost)
            if not self.fits(head, ahead=len(granted), ahead_cost=granted_cost):
                break
            del queue[ticket]
            self._costs.pop(ticket, None)
            granted.append(ticket)
            granted_cost += cost
        return granted

    def expire(self, now_s: float, view: LoadView) -> list[tuple[Hashable, Decision]]:
        """The waiters whose `queue_max_wait_s` has passed (call `grant` first), removed,
        with their refusal."""
        expired: list[tuple[Hashable, Decision]] = []
        for ticket, deadline_s in list(self._queue.items()):
            if deadline_s <= now_s:
                del self._queue[ticket]
                self._costs.pop(ticket, None)
                wait_s = self.predict_wait_s(view, ahead=0)
                expired.append((ticket, self._refusal(view, wait_s, 0, "queue_timeout")))
        return expired

    def next_deadline_s(self) -> float | None:
        """When the queue's first waiter times out (None: nobody waits)."""
        return next(iter(self._queue.values()), None)

    def leave(self, ticket: Hashable) -> bool:
        """A waiter gone (its client left): out of the queue. False if it was not there."""
        self._costs.pop(ticket, None)
        return self._queue.pop(ticket, None) is not None

    def clear(self) -> list[Hashable]:
        """Every waiter, removed (the engine stops taking streams)."""
        tickets = list(self._queue)
        self._queue.clear()
        self._costs.clear()
        return tickets

    def predict_wait_s(self, view: LoadView, ahead: int = 0) -> float:
        """Seconds until one more request fits behind `ahead` waiters, if the capacity
        is shared evenly by the streams with work left (processor sharing) and nothing
        else arrives: streams leave their start phase and end as their owed audio is
        produced; granted tickets, and each waiter ahead once it fits, start as new
        streams (`new_stream_audio_s`, `start_audio_s`). inf when no such moment is in
        sight (live text streams hold their slot until their client closes them)."""
        capacity = view.capacity_audio_s_per_s
        if not capacity > 0:  # only max_streams binds; ends are predicted at 1x
            capacity = 1.0
        start_s = min(view.start_audio_s, view.new_stream_audio_s)
        # [owed, start left, cost]: a stream of cost c gets C / n / c audio s per s
        streams = [[s.owed_audio_s, s.start_left_audio_s, s.cost] for s in view.streams]
        granted_cost = view.granted if view.granted_cost is None else view.granted_cost
        each = granted_cost / view.granted if view.granted else 1.0
        streams += [[view.new_stream_audio_s, start_s, each] for _ in range(view.granted)]
        waiters = [self._costs.get(ticket, 1.0) for ticket in list(self._queue)[:ahead]]
        waiters += [1.0] * (ahead - len(waiters))
        t_s = 0.0
        for _ in range(2 * (len(streams) + ahead) + 2):
            while True:
                loads = [StreamLoad(owed, left, cost=cost) for owed, left, cost in streams]
                probe = LoadView(
                    view.capacity_audio_s_per_s, loads, new_stream_cost=view.new_stream_cost
                )
                if not self.fits(probe, ahead_cost=0.0):
                    break
                if not waiters:
                    return t_s
                # the next waiter starts
                streams.append([view.new_stream_audio_s, start_s, waiters.pop(0)])
            if not streams:
                return math.inf  # (an idle engine takes one: not reached)
            share = capacity / len(streams)  # reference audio s per s each
            step_s = min(
                (min(left, owed) if left > 0 else owed) * cost / share
                for owed, left, cost in streams
            )
            if not math.isfinite(step_s):
                return math.inf
            t_s += step_s
            kept = []
            for owed, left, cost in streams:
                produced = step_s * share / cost
                owed -= produced
                left = max(0.0, left - produced) if left > 0 else 0.0
                if owed > 1e-9:
                    kept.append([owed, 0.0 if left <= 1e-9 else left, cost])
            streams = kept
        return math.inf

    def _refusal(
        self, view: LoadView, wait_s: float, ahead: int, reason: str | None = None
    ) -> Decision:
        config = self._config
        if reason is None:
            taken = len(view.streams) + view.granted + ahead
            full = config.max_streams and taken >= config.max_streams
            reason = "max_streams" if full else "capacity"
        if not math.isfinite(wait_s):  # no end in sight: try again after one queue bound
            wait_s = max(1.0, config.queue_max_wait_s)
        return Decision(False, max(1, math.ceil(wait_s)), reason, None)
