"""The jobs' Prometheus metrics, in the app's registry: jobs by state, job audio made,
the share of the capacity jobs used."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.jobs.job import JobState
from app.jobs.store import JobStore

SHARE_WINDOW_S = 60.0


class JobMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._store: JobStore | None = None
        self.by_state = Gauge("playhead_jobs", "Jobs held, by state", ["state"], registry=registry)
        self.audio_s = Counter(
            "playhead_job_audio_seconds",
            "Audio seconds jobs made (durable segments)",
            registry=registry,
        )
        self.ended_total = Counter(
            "playhead_jobs_ended", "Jobs that ended, by state", ["state"], registry=registry
        )
        self.capacity_share = Gauge(
            "playhead_job_capacity_share",
            "Share of the engine's capacity jobs used, over the last minute (job audio "
            "seconds per second / capacity)",
            registry=registry,
        )
        self._recent: list[tuple[float, float]] = []  # (monotonic s, audio s)
        for state in JobState:
            self.by_state.labels(state.value).set_function(self._counter(state))

    def _counter(self, state: JobState):  # type: ignore[no-untyped-def]
        def count() -> float:
            store = self._store
            if store is None:
                return 0.0
            try:
                return float(store.count_state(state))
            except Exception:  # a closed store: nothing to report
                return 0.0

        return count

    def watch(self, store: JobStore) -> None:
        self._store = store

    def made(self, audio_s: float, now_s: float, capacity_audio_s_per_s: float) -> None:
        """A segment of `audio_s` made at `now_s` (monotonic): counted, and the share of the
        capacity jobs used over the last SHARE_WINDOW_S updated."""
        self.audio_s.inc(audio_s)
        recent = self._recent
        recent.append((now_s, audio_s))
        while recent and recent[0][0] < now_s - SHARE_WINDOW_S:
            recent.pop(0)
        if capacity_audio_s_per_s > 0:
            rate = sum(a for _, a in recent) / SHARE_WINDOW_S
            self.capacity_share.set(min(1.0, rate / capacity_audio_s_per_s))

    def ended(self, state: JobState) -> None:
        self.ended_total.labels(state.value).inc()
