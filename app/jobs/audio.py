"""A job's audio as the client gets it: its segments' PCM, encoded, followed as it is made.

The encoding is a function of the PCM alone: the encoder is fed blocks of
`BLOCK_SAMPLES` counted from the job's first sample, whatever the segment boundaries and
whenever they were made, so the bytes streamed while a job renders are the bytes of its
final file (`final.<fmt>`, written once it is done, served with byte ranges), and a
download cut anywhere resumes at a byte offset (`?offset_bytes=N`, or a Range once done).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np

from app.audio import open_encoder
from app.encoding_config import EncodingConfig
from app.jobs.job import BYTES_PER_SAMPLE, Job, JobState, JobStoreError
from app.jobs.store import JobStore

BLOCK_SAMPLES = 16384  # PCM fed to the encoder per call, counted from the job's start
FOLLOW_POLL_S = 1.0


class JobGone(Exception):
    """The job was deleted, or failed, while its audio was being read."""


def _read_samples(store: JobStore, job: Job, start: int, stop: int) -> np.ndarray:
    """The job's PCM [start, stop) in samples, float32, from its made segments."""
    out = []
    for made in store.made(job.id):
        seg_start, seg_stop = made.start_sample, made.start_sample + made.samples
        lo, hi = max(start, seg_start), min(stop, seg_stop)
        if lo >= hi:
            continue
        path = store.segment_path(job.id, made.index)
        try:
            with open(path, "rb") as file:
                file.seek((lo - seg_start) * BYTES_PER_SAMPLE)
                data = file.read((hi - lo) * BYTES_PER_SAMPLE)
        except FileNotFoundError:
            raise JobStoreError(f"the audio file of segment {made.index} is missing") from None
        if len(data) != (hi - lo) * BYTES_PER_SAMPLE:
            raise JobStoreError(f"the audio file of segment {made.index} is short")
        out.append(np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0)
    return np.concatenate(out) if out else np.zeros(0, np.float32)


async def encoded_audio(
    store: JobStore,
    job_id: str,
    encoding: EncodingConfig,
    *,
    changed: Callable[[], asyncio.Event],
    follow: bool = True,
) -> AsyncIterator[bytes]:
    """The job's encoded audio from its first byte: what is made, then (follow) what is
    made next, until the job is done. JobGone when it is deleted or fails meanwhile."""
    job = store.get(job_id)
    if job is None:
        raise JobGone("the job was deleted")
    encoder = open_encoder(
        job.response_format, job.sample_rate_hz, job.output_rate_hz, encoding=encoding
    )
    position = 0
    try:
        while True:
            event = changed()
            job = store.get(job_id)
            if job is None:
                raise JobGone("the job was deleted")
            if job.state is JobState.FAILED:
                raise JobGone(f"the job failed: {job.error}")
            made = store.progress(job_id).samples
            done = job.state is JobState.DONE
            while made - position >= BLOCK_SAMPLES or (done and position < made):
                stop = min(position + BLOCK_SAMPLES, made)
                pcm = await asyncio.to_thread(_read_samples, store, job, position, stop)
                position = stop
                data = await asyncio.to_thread(encoder.encode, pcm)
                if data:
                    yield data
            if done:
                tail = await asyncio.to_thread(encoder.finish)
                if tail:
                    yield tail
                return
            if not follow:
                return
            # the runner here sets it; a job rendered by another replica (a shared store)
            # is looked at again after FOLLOW_POLL_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FOLLOW_POLL_S):
                    await event.wait()
    finally:
        encoder.close()


async def write_final(store: JobStore, job: Job, encoding: EncodingConfig) -> Path:
    """The done job's final file (made once, by the rename rule)."""
    final = store.final_path(job.id, job.response_format)
    if final.exists():
        return final
    temp = final.parent / f"final.tmp.{os.getpid()}.{id(job)}"
    try:
        with open(temp, "wb") as file:
            async for data in encoded_audio(
                store, job.id, encoding, changed=asyncio.Event, follow=False
            ):
                file.write(data)
        await asyncio.to_thread(store.write_final, job.id, job.response_format, temp)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
    return final
