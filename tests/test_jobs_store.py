"""The jobs' store at each crash point of the rename rule (STYLE.md "Durable state"):
a crash before the rename, between the rename and the commit, and a file cut short or
deleted underneath; `reconcile` leaves a job at its last whole segment, never with a row
that points at half a file. And leases: replicas sharing a store never render one job
twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.jobs.job import Job, JobState, JobStoreError
from app.jobs.store import JobStore
from app.jobs.text import cut_segments

TEXT = "One sentence here. Another one there. A third one now. And the last one."
RUNNER = "runner-a"


def _job(store: JobStore, job_id: str = "job_test", state: JobState = JobState.QUEUED) -> Job:
    job = Job(
        id=job_id,
        owner="",
        title=None,
        state=state,
        voice="sim",
        speed=1.0,
        response_format="wav",
        sample_rate_hz=1000,
        output_rate_hz=24000,
        finish_by_s=None,
        created_s=1.0,
        finished_s=None,
        text_chars=len(TEXT),
        error=None,
    )
    store.create(job, TEXT, cut_segments(TEXT, 20))
    return job


def _make(store: JobStore, job: Job, index: int, start: int, samples: int) -> None:
    store.part_path(job.id, index, RUNNER).write_bytes(b"\x01\x00" * samples)
    store.commit_segment(job.id, index, start, samples, [], RUNNER)


def test_each_crash_point_leaves_the_last_whole_segment(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = _job(store)
    _make(store, job, 0, 0, 100)
    _make(store, job, 1, 100, 50)
    # crash while segment 2 was written (before the rename): a .part is left
    store.part_path(job.id, 2, RUNNER).write_bytes(b"\x01\x00" * 10)
    # crash between the rename and the commit of segment 2: a .pcm without a row
    store.segment_path(job.id, 2).write_bytes(b"\x01\x00" * 70)
    store.close()

    store = JobStore(tmp_path)
    repairs = store.reconcile(at_s=10.0)
    assert len(repairs) == 2
    assert [m.index for m in store.made(job.id)] == [0, 1]
    assert store.progress(job.id).samples == 150
    assert sorted(p.name for p in (tmp_path / "audio" / job.id).iterdir()) == [
        "000000.pcm",
        "000001.pcm",
    ]
    assert store.get(job.id).state is JobState.RENDERING


def test_a_short_or_missing_file_takes_an_unfinished_job_back(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = _job(store)
    for index in range(3):
        _make(store, job, index, index * 100, 100)
    store.segment_path(job.id, 1).write_bytes(b"\x01\x00" * 40)  # cut short underneath
    store.reconcile(at_s=10.0)
    assert [m.index for m in store.made(job.id)] == [0]  # back to the last whole one
    assert not store.segment_path(job.id, 2).exists()


def test_a_finished_job_whose_audio_is_gone_fails_with_why(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = _job(store)
    _make(store, job, 0, 0, 100)
    store.set_state(job.id, JobState.DONE, at_s=5.0)
    store.segment_path(job.id, 0).unlink()
    store.reconcile(at_s=10.0)
    failed = store.get(job.id)
    assert failed.state is JobState.FAILED and "segment 0 is missing" in failed.error


def test_a_commit_of_a_part_cut_short_is_refused(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = _job(store)
    store.part_path(job.id, 0, RUNNER).write_bytes(b"\x01\x00" * 99)
    with pytest.raises(JobStoreError, match="198 bytes on disk, 200 made"):
        store.commit_segment(job.id, 0, 0, 100, [], RUNNER)
    assert store.made(job.id) == []


def test_a_corrupt_row_is_an_error_for_that_job(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    job = _job(store)
    other = _job(store, "job_other")
    store._db.execute("UPDATE jobs SET state = 'melted' WHERE id = ?", (job.id,))
    with pytest.raises(JobStoreError, match="corrupt"):
        store.get(job.id)
    store.reconcile(at_s=10.0)
    assert store.get(job.id).state is JobState.FAILED  # its state was rewritten: readable
    assert store.get(other.id).state is JobState.QUEUED


def test_leases_keep_two_runners_off_one_job(tmp_path: Path) -> None:
    first, second = JobStore(tmp_path), JobStore(tmp_path)  # two replicas, one store
    job = _job(first)
    assert first.claim(job.id, "a", now_s=100.0, lease_s=60.0)
    assert not second.claim(job.id, "b", now_s=120.0, lease_s=60.0)
    assert first.claim(job.id, "a", now_s=150.0, lease_s=60.0)  # renewed
    assert not second.claim(job.id, "b", now_s=200.0, lease_s=60.0)
    assert second.claim(job.id, "b", now_s=211.0, lease_s=60.0)  # a's lease ran out
    # a replica starting while b renders leaves b's files alone
    second.part_path(job.id, 0, "b").write_bytes(b"\x00\x00")
    first.reconcile(at_s=220.0)
    assert second.part_path(job.id, 0, "b").exists()


def test_finished_jobs_and_their_audio_go_after_keep_days_and_nothing_else(
    tmp_path: Path,
) -> None:
    """`jobs.keep_days` (7): at day 7.5 of a fake wall clock, the done and the failed job
    that ended at day 0 are deleted, rows and audio; the one that ended at day 6.5, the
    queued one and the rendering one (however old) stay."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from app.jobs.config import JobsConfig
    from app.jobs.metrics import JobMetrics
    from app.jobs.runner import JobRunner

    day_s = 86400.0
    store = JobStore(tmp_path)
    ended = {"old_done": (JobState.DONE, 0.0), "old_failed": (JobState.FAILED, 0.0)}
    ended["recent_done"] = (JobState.DONE, 6.5 * day_s)
    for job_id, (state, at_s) in ended.items():
        _make(store, _job(store, job_id), 0, 0, 100)
        store.set_state(job_id, state, error="x" if state is JobState.FAILED else None, at_s=at_s)
    _job(store, "queued")
    _make(store, _job(store, "rendering", JobState.RENDERING), 0, 0, 100)
    runner = JobRunner(
        JobsConfig(keep_days=7.0),
        tmp_path,
        engine=lambda: None,
        wait_loaded=lambda: None,
        normalize=None,
        metrics=JobMetrics(CollectorRegistry()),
        wall_clock=lambda: 7.5 * day_s,
    )
    asyncio.run(runner._expire(store))
    assert sorted(store.ids()) == ["queued", "recent_done", "rendering"]
    assert not (store.audio_dir / "old_done").exists()
    assert not (store.audio_dir / "old_failed").exists()
    assert store.segment_path("recent_done", 0).exists()
    assert store.segment_path("rendering", 0).exists()
