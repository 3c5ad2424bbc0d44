"""Admission's async front: the engine's reservations and its one fair queue.

The policy is scheduling.Admission (pure, shared with the simulator); this module adds
what asyncio needs: a future per waiting reservation, one timer for the queue's next
deadline, and the grants run from the event loop when a slot may have freed (a stream
left its start phase or ended, a reservation was given back, a vocoder turn moved the
capacity).

Every protocol admits the same way:

    reservation = engine.reserve()          # Rejected (429) or NotReady (503) at once
    await reservation.wait_start()          # waits in the queue; Rejected / NotReady
    stream = engine.submit(text, voice=..., reservation=reservation)

and `release()`s the reservation on any other way out (a no-op once submit used it).
`admit(engine, gone)` does the first two while watching for the client to leave: a
waiter whose client disconnects leaves the queue at once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from pipeline.backend import Voice
from pipeline.errors import NotReady, Rejected
from pipeline.events import EngineEvents
from scheduling import (
    Admission,
    AdmissionConfig,
    ChunkingConfig,
    Decision,
    LoadView,
    StreamLoad,
)


def start_phase_chunks(config: AdmissionConfig) -> int:
    """The book's `start_phase_chunks`: tracked where admission counts a start's cost."""
    return config.start_phase_chunks if config.enabled and config.start_cost else 0


def new_stream_audio_s(loads: Sequence[StreamLoad], mean_audio_s: float) -> float:
    """What a request not yet read is predicted to owe: the mean of what the streams
    owe now, else the mean stream's audio so far (inf: nothing known)."""
    owed = [load.owed_audio_s for load in loads if math.isfinite(load.owed_audio_s)]
    return sum(owed) / len(owed) if owed else mean_audio_s


def start_chunk_audio_s(chunking: ChunkingConfig, voice: Voice) -> float:
    """Audio of one start-phase chunk, for the owed work's start part (the ramp's first
    chunk or a steady one, the larger)."""
    frames = max(chunking.ramp[0] if chunking.ramp else 0, chunking.chunk_frames)
    return frames * voice.samples_per_frame / voice.sample_rate_hz


class Reservation:
    """A request's place in admission, for one `submit` or one `release`.

    Granted at once, or queued (`queued`): `await wait_start()` before `submit`. A
    granted reservation counts as a starting stream until it is used or released."""

    __slots__ = ("_front", "_future", "_queued_at_s", "cost", "granted", "start_wait_s")

    def __init__(self, front: AdmissionFront, cost: float = 1.0) -> None:
        self._front: AdmissionFront | None = front
        self.granted = False
        # its voice's cost against the reference voice's (scheduling/voice_cost.py)
        self.cost = cost
        # how long it waited in the queue (the stream's `StreamStats.start_wait_s`)
        self.start_wait_s = 0.0
        self._queued_at_s = 0.0
        self._future: asyncio.Future[None] | None = None

    @property
    def queued(self) -> bool:
        """Waiting in the queue (not granted, not refused yet)."""
        return self._future is not None and not self._future.done()

    async def wait_start(self) -> None:
        """Returns once granted (at once if it was); raises Rejected ("queue_timeout")
        when no slot freed within its longest wait (`admission.queue_max_wait_s`, or the
        first-audio bound less the measured first audio), NotReady when the engine
        stops or drains meanwhile. Cancelled (its client gone): `release` it."""
        if self._future is not None:
            # shielded: a cancelled waiter (its client gone) leaves the future to
            # `release`, so a grant already on its way never meets a cancelled future
            await asyncio.shield(self._future)

    def take(self, front: AdmissionFront) -> bool:
        """Use the reservation up for a stream created at once, without yielding (True),
        or False if it was used, released, or never granted."""
        if self._front is not front or not self.granted:
            return False
        self._front = None
        front.release(self)
        return True

    def release(self) -> None:
        """Give the reservation back unused (idempotent)."""
        front, self._front = self._front, None
        if front is not None:
            front.release(self)


class AdmissionFront:
    """The engine's admission: one Admission policy and queue, the granted count, the
    futures of the waiters. `load(now_s, granted)` is the engine's view of the load."""

    def __init__(
        self,
        admission: Admission,
        *,
        clock: Callable[[], float],
        events: EngineEvents,
        load: Callable[[float, int], LoadView],
    ) -> None:
        self.policy = admission
        self._clock = clock
        self._events = events
        self._load = load
        self.granted = 0  # reservations granted, not yet streams
        self.granted_cost = 0.0  # their costs summed
        self._waiters: dict[Reservation, None] = {}
        self._grant_pending = False
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return self.policy.waiting

    def view(self, now_s: float, cost: float = 1.0) -> LoadView:
        """The engine's load, with the granted reservations' costs and a request of
        `cost` to decide."""
        view = self._load(now_s, self.granted)
        granted_cost = max(0.0, self.granted_cost) if self.granted else 0.0
        return replace(view, granted_cost=granted_cost, new_stream_cost=cost)

    def reserve(self, now_s: float, cost: float = 1.0) -> Reservation:
        """Decide now, for a request of `cost` (its voice's): a granted reservation, a
        queued one, or Rejected."""
        reservation = Reservation(self, cost)
        decision = self.policy.offer(now_s, reservation, self.view(now_s, cost))
        if decision.accept:
            self._grant(reservation, waited_s=0.0)
            return reservation
        if not decision.queued:
            reservation._front = None
            raise self._refused(decision)
        reservation._queued_at_s = now_s
        reservation._future = asyncio.get_running_loop().create_future()
        self._waiters[reservation] = None
        self._arm_timer()
        return reservation

    def check_now(self, now_s: float, cost: float = 1.0) -> None:
        """Admission for a caller that cannot wait (a submit without reservation) of
        `cost`: returns when it fits now, raises Rejected otherwise."""
        decision = self.policy.offer(now_s, None, self.view(now_s, cost), wait=False)
        if not decision.accept:
            raise self._refused(decision)

    def poke(self) -> None:
        """A slot may be free: grant from the event loop (not from inside the book's
        transition that freed it)."""
        if self._grant_pending or not self._waiters:
            return
        self._grant_pending = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a book driven by hand): at once
            self.run_grants()
        else:
            loop.call_soon(self.run_grants)

    def run_grants(self) -> None:
        """Grant the queue's head while it fits; refuse the waiters past their bound."""
        self._grant_pending = False
        now_s = self._clock()
        for reservation in self.policy.grant(self.view(now_s)):
            self._waiters.pop(reservation, None)  # type: ignore[call-overload]
            self._grant(reservation, waited_s=max(0.0, now_s - reservation._queued_at_s))
            # pending: only run_grants, expire and refuse_all settle a waiter's future (its
            # wait is shielded), and each takes it from the queue first
            assert reservation._future is not None
            reservation._future.set_result(None)
        for reservation, decision in self.policy.expire(now_s, self.view(now_s)):
            self._waiters.pop(reservation, None)  # type: ignore[call-overload]
            reservation._front = None
            future = reservation._future
            if future is not None and not future.done():
                future.set_exception(self._refused(decision))
        self._arm_timer()

    def refuse_all(self, why: str) -> None:
        """The engine takes no more streams: every waiter gets NotReady (a 503)."""
        self.policy.clear()
        waiters, self._waiters = self._waiters, {}
        for reservation in waiters:
            reservation._front = None
            future = reservation._future
            if future is not None and not future.done():
                future.set_exception(NotReady(why))
        self._arm_timer()

    def release(self, reservation: Reservation) -> None:
        if reservation.granted:
            reservation.granted = False
            self.granted -= 1
            self.granted_cost -= reservation.cost
        elif self.policy.leave(reservation):
            self._waiters.pop(reservation, None)
        future = reservation._future
        if future is not None:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: a refusal nobody awaited is no error
        self.poke()  # a slot, or a place in the queue, is free

    def _grant(self, reservation: Reservation, waited_s: float) -> None:
        reservation.granted = True
        reservation.start_wait_s = waited_s
        self.granted += 1
        self.granted_cost += reservation.cost
        self._events.start_waited(waited_s)

    def _refused(self, decision: Decision) -> Rejected:
        self._events.rejected(decision.reason)
        return Rejected(decision)

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline_s = self.policy.next_deadline_s()
        if deadline_s is not None:
            delay_s = max(0.0, deadline_s - self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay_s, self.run_grants)


async def wait_admitted(reservation: Reservation, gone: Awaitable[object] | None) -> bool:
    """`await reservation.wait_start()`, unless `gone` (the client's disconnect) completes
    first: then the reservation is released and False returned. Rejected and NotReady
    propagate (the reservation is then spent)."""
    if not reservation.queued:
        if asyncio.iscoroutine(gone):
            gone.close()  # never awaited: no "coroutine was never awaited" warning
        return True
    if gone is None:
        await reservation.wait_start()
        return True
    watcher = asyncio.ensure_future(gone)
    waiter = asyncio.ensure_future(reservation.wait_start())
    try:
        await asyncio.wait((watcher, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not waiter.done():
            waiter.cancel()
        await asyncio.gather(watcher, waiter, return_exceptions=True)
    if waiter.cancelled() or not waiter.done():
        reservation.release()
        return False
    waiter.result()  # Rejected / NotReady
    return True


async def admit(
    engine: object, gone: Awaitable[object] | None = None, *, voice: str | None = None
) -> Reservation | None:
    """`engine.reserve(voice)` then wait in the queue while watching `gone`: the
    reservation to hand to `engine.submit`, or None when the client left while waiting.
    Rejected and NotReady propagate."""
    try:
        reserve = engine.reserve  # type: ignore[attr-defined]
        reservation = reserve() if voice is None else reserve(voice)
    except BaseException:
        if asyncio.iscoroutine(gone):
            gone.close()  # refused at once: never awaited, and no warning that says so
        raise
    try:
        if await wait_admitted(reservation, gone):
            return reservation
    except BaseException:
        reservation.release()
        raise
    return None
