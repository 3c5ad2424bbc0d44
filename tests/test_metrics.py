"""app/metrics.py: EngineEvents land in the app's own Prometheus registry."""

from __future__ import annotations

import gc
import threading

from api_support import metric_value

from app.metrics import Metrics
from pipeline import EngineEvents, EngineStats, StreamState, StreamStats

REQUIRED = (
    "playhead_active_streams",
    "playhead_parked_streams",
    "playhead_ttfa_seconds_bucket",
    "playhead_start_wait_seconds_bucket",
    "playhead_stalls_total",
    "playhead_stall_seconds_total",
    "playhead_vocoder_batch_size_bucket",
    "playhead_vocoder_turn_seconds_bucket",
    "playhead_talker_call_seconds_bucket",
    "playhead_admission_rejections_total",
    "playhead_capacity_audio_seconds_per_second",
    "playhead_streams_total",
)


def _stats(**fields: float) -> EngineStats:
    base = {
        "active_streams": 0,
        "parked_streams": 0,
        "capacity_audio_s_per_s": 0.0,
        "policy": "edf",
    }
    return EngineStats(**{**base, **fields})  # type: ignore[arg-type]


def test_metrics_implements_engine_events() -> None:
    events: EngineEvents = Metrics()  # a type check as much as a runtime one
    for name in EngineEvents.__dict__:
        if not name.startswith("_"):
            assert callable(getattr(events, name)), name


def test_every_required_metric_is_exposed_after_events() -> None:
    m = Metrics()
    m.stream_started("a")
    m.first_audio("a", 0.12)
    m.stall("a", 0.25)
    m.vocoder_turn(3, 0.015)
    m.talker_call(0.04)
    m.rejected("max_streams")
    m.start_waited(0.0)  # a start slot was free
    m.start_waited(0.3)  # waited in the start queue
    m.stream_finished(StreamStats("a", 0.0, ttfa_s=0.12, audio_s=2.5), StreamState.DONE)
    m.capacity(3.0)  # the event is ignored: the scrape reads the engine's estimate
    text = m.render(_stats(active_streams=2, parked_streams=1, capacity_audio_s_per_s=7.5)).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    missing = [name for name in REQUIRED if name not in names]
    assert not missing, missing
    assert metric_value(text, "playhead_active_streams") == 2
    assert metric_value(text, "playhead_parked_streams") == 1
    assert metric_value(text, "playhead_capacity_audio_seconds_per_second") == 7.5
    assert metric_value(text, "playhead_stalls_total") == 1
    assert metric_value(text, "playhead_stall_seconds_total") == 0.25
    assert metric_value(text, "playhead_ttfa_seconds_count") == 1
    assert metric_value(text, "playhead_ttfa_seconds_sum") == 0.12
    assert metric_value(text, "playhead_start_wait_seconds_count") == 2
    assert metric_value(text, "playhead_start_wait_seconds_sum") == 0.3
    assert metric_value(text, "playhead_start_wait_seconds_bucket", 'le="0.01"') == 1
    assert metric_value(text, "playhead_vocoder_batch_size_sum") == 3
    assert metric_value(text, "playhead_talker_call_seconds_count") == 1
    assert metric_value(text, "playhead_admission_rejections_total", 'reason="max_streams"') == 1
    assert metric_value(text, "playhead_streams_total", 'state="done"') == 1
    assert metric_value(text, "playhead_audio_seconds_total") == 2.5
    assert metric_value(text, "playhead_ready") == 1


def test_not_ready_render_zeroes_the_engine_gauges() -> None:
    m = Metrics()
    m.render(_stats(active_streams=4, parked_streams=2))
    text = m.render(None).decode()
    assert metric_value(text, "playhead_active_streams") == 0
    assert metric_value(text, "playhead_parked_streams") == 0
    assert metric_value(text, "playhead_ready") == 0


def test_the_capacity_gauge_comes_from_the_scrape_only() -> None:
    m = Metrics()
    m.capacity(3.0)
    assert metric_value(m.render(None).decode(), "playhead_capacity_audio_seconds_per_second") == 0
    text = m.render(_stats(capacity_audio_s_per_s=7.5)).decode()
    assert metric_value(text, "playhead_capacity_audio_seconds_per_second") == 7.5


def test_each_stage_reports_its_own_capacity() -> None:
    """Which stage bounds the pipeline's estimate, on one scrape."""
    stats = _stats(
        capacity_audio_s_per_s=7.5,
        talker_capacity_audio_s_per_s=31.0,
        vocoder_capacity_audio_s_per_s=7.5,
    )
    text = Metrics().render(stats).decode()
    name = "playhead_stage_capacity_audio_seconds_per_second"
    assert metric_value(text, name, 'stage="talker"') == 31.0
    assert metric_value(text, name, 'stage="vocoder"') == 7.5


def test_two_apps_do_not_share_counters() -> None:
    first, second = Metrics(), Metrics()
    first.stall("a", 1.0)
    first.stream_finished(StreamStats("a", 0.0), StreamState.CANCELLED)
    text = second.render(None).decode()
    assert metric_value(text, "playhead_stalls_total") == 0
    assert metric_value(text, "playhead_streams_total", 'state="cancelled"') == 0
    text = first.render(None).decode()
    assert metric_value(text, "playhead_streams_total", 'state="cancelled"') == 1


def test_garbage_collections_are_timed_while_watched() -> None:
    metrics = Metrics()

    def full_collections() -> float:
        value = metrics.registry.get_sample_value(
            "playhead_gc_pause_seconds_count", {"generation": "2"}
        )
        return value or 0.0

    gc.collect()
    assert full_collections() == 0  # not watched yet
    metrics.watch_gc()
    metrics.watch_gc()  # once only
    try:
        gc.collect()
        gc.collect()
        assert full_collections() == 2
        total_s = metrics.registry.get_sample_value(
            "playhead_gc_pause_seconds_sum", {"generation": "2"}
        )
        assert total_s is not None and total_s > 0
    finally:
        metrics.unwatch_gc()
    gc.collect()
    assert full_collections() == 2


def test_a_collection_under_the_histograms_lock_does_not_deadlock_the_thread() -> None:
    """Whoever holds the pause histogram's lock may allocate there (`labels()` making a
    child, a scrape copying them), and a collection triggered there runs the gc callback
    on the same thread: the callback must not take that lock again."""
    metrics = Metrics()

    def new_child_with_a_collection_at_every_allocation() -> None:
        thresholds = gc.get_threshold()
        gc.set_threshold(1)  # every tracked allocation triggers a young collection
        try:
            metrics.gc_pause_s.labels(generation="test")  # made under the lock
        finally:
            gc.set_threshold(*thresholds)

    metrics.watch_gc()
    try:
        worker = threading.Thread(
            target=new_child_with_a_collection_at_every_allocation, daemon=True
        )
        worker.start()
        worker.join(timeout=60.0)  # a hang guard, not a bound
        assert not worker.is_alive(), "a collection under the lock deadlocked in the callback"
    finally:
        metrics.unwatch_gc()
    young = metrics.registry.get_sample_value(
        "playhead_gc_pause_seconds_count", {"generation": "0"}
    )
    assert young is not None and young > 0
