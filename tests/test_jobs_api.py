"""/v1/audio/jobs on the sim backend, in process: create, list, get, audio (followed while
it renders, the same bytes as the final file, byte ranges, a resumed download),
timestamps, chapters, delete, and hostile input (a body too large, a binary file, ids that
are not jobs, another key's job, DELETE during a download, a finish_by that cannot be met,
the disk limit, a corrupt row, an audio file deleted underneath)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from api_support import (
    asgi_client,
    decode,
    expected_audio_s,
    live_server,
    metric_value,
    sim_settings,
)

from app.settings import Settings

TEXT = " ".join(f"Sentence {n} is a plain sentence of this job." for n in range(12))
MARKDOWN = """# The first part

It begins here. It goes on a little.

## A second heading

More text after it. And *more* text, with a [link](https://example.com).

Plain Title Line

The last paragraph ends the job.
"""


def _settings(tmp_path: Path, *more: str) -> Settings:
    return sim_settings(f"jobs.dir={tmp_path}", "jobs.segment_chars=120", *more)


async def _wait_done(client: httpx.AsyncClient, job_id: str, timeout_s: float = 20.0) -> dict:
    async with asyncio.timeout(timeout_s):
        while True:
            job = (await client.get(f"/v1/audio/jobs/{job_id}")).json()
            if job.get("state") in ("done", "failed"):
                return job
            await asyncio.sleep(0.02)


async def _create(client: httpx.AsyncClient, **fields: object) -> dict:
    body = {"input": TEXT, "voice": "sim", "response_format": "wav", **fields}
    response = await client.post("/v1/audio/jobs", json=body)
    assert response.status_code == 202, response.text
    assert response.headers["location"] == f"/v1/audio/jobs/{response.json()['id']}"
    return response.json()


async def test_a_job_renders_and_its_audio_follows_then_serves_ranges(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path)) as client:
        job = await _create(client, response_format="mp3", title="A test")
        assert job["state"] in ("queued", "rendering") and job["title"] == "A test"
        assert job["id"].startswith("job_") and len(job["id"]) >= 24  # 128 random bits
        followed = (await client.get(f"/v1/audio/jobs/{job['id']}/audio")).content
        done = await _wait_done(client, job["id"])
        assert done["state"] == "done"
        assert done["progress"]["characters_done"] == len(TEXT)
        audio_s = done["progress"]["audio_seconds"]
        assert audio_s > 5
        final = await client.get(f"/v1/audio/jobs/{job['id']}/audio")
        assert final.status_code == 200
        assert final.content == followed  # the stream while rendering is the final file
        pcm, rate_hz = decode(final.content, "mp3")
        assert abs(pcm.size / rate_hz - audio_s) < 0.2
        ranged = await client.get(
            f"/v1/audio/jobs/{job['id']}/audio", headers={"Range": "bytes=1000-1999"}
        )
        assert ranged.status_code == 206 and ranged.content == final.content[1000:2000]
        resumed = await client.get(f"/v1/audio/jobs/{job['id']}/audio?offset_bytes=1234")
        assert resumed.content == final.content[1234:]


async def test_timestamps_and_chapters_index_the_text_as_sent(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path)) as client:
        response = await client.post(
            "/v1/audio/jobs?voice=sim&response_format=flac&title=Notes",
            content=MARKDOWN.encode(),
            headers={"Content-Type": "text/markdown"},
        )
        assert response.status_code == 202, response.text
        job = await _wait_done(client, response.json()["id"])
        assert job["state"] == "done" and job["title"] == "Notes"
        chapters = job["chapters"]
        assert [c["title"] for c in chapters] == [
            "The first part",
            "A second heading",
            "Plain Title Line",
        ]
        starts = [c["start_s"] for c in chapters]
        assert starts[0] == 0.0 and starts == sorted(starts) and starts[-1] > 1.0
        body = (await client.get(f"/v1/audio/jobs/{job['id']}/timestamps")).json()
        words = body["words"]
        assert body["complete"] is True
        for word in words:
            assert MARKDOWN[word["start_index"] : word["end_index"]] == word["word"]
        spoken = [w["word"] for w in words]
        assert spoken[:3] == ["The", "first", "part"] and "https://example.com" not in " ".join(
            spoken
        )
        times = [w["start_s"] for w in words]
        assert times == sorted(times)
        # a chapter starts where its heading's first word is heard
        second = next(w for w in words if w["word"] == "second")
        assert chapters[1]["start_s"] <= second["start_s"] < chapters[2]["start_s"]


async def test_list_pages_and_delete(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path)) as client:
        ids = [(await _create(client, input=f"Job number {n}."))["id"] for n in range(3)]
        first = (await client.get("/v1/audio/jobs?limit=2")).json()
        assert [j["id"] for j in first["data"]] == ids[:2] and first["has_more"] is True
        rest = (await client.get(f"/v1/audio/jobs?limit=2&after={first['last_id']}")).json()
        assert [j["id"] for j in rest["data"]] == ids[2:] and rest["has_more"] is False
        deleted = await client.delete(f"/v1/audio/jobs/{ids[0]}")
        assert deleted.json() == {"id": ids[0], "object": "audio.job.deleted", "deleted": True}
        gone = await client.get(f"/v1/audio/jobs/{ids[0]}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "job_not_found"
        assert not (tmp_path / "audio" / ids[0]).exists()


async def test_hostile_input_gets_clear_errors(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "jobs.max_request_bytes=1048576", "jobs.max_text_chars=100000")
    async with asgi_client(settings) as client:
        big = await client.post(
            "/v1/audio/jobs",
            content=b'{"input": "' + b"a" * (10 * 1024 * 1024) + b'", "voice": "sim"}',
            headers={"Content-Type": "application/json"},
        )
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        long = await client.post("/v1/audio/jobs", json={"input": "word " * 30000, "voice": "sim"})
        assert long.status_code == 400
        assert long.json()["error"]["code"] == "string_above_max_length"
        binary = await client.post(
            "/v1/audio/jobs?voice=sim",
            content=bytes(range(256)) * 8,
            headers={"Content-Type": "text/plain"},
        )
        assert binary.status_code == 400 and binary.json()["error"]["code"] == "invalid_file"
        nul = await client.post(
            "/v1/audio/jobs?voice=sim",
            content=b"text\x00more",
            headers={"Content-Type": "text/plain"},
        )
        assert nul.status_code == 400 and nul.json()["error"]["param"] == "file"
        for bad_id in ("nope", "job_" + "A" * 22, "x" * 5000, "../../etc/passwd"):
            for suffix in ("", "/audio", "/timestamps"):
                response = await client.get(f"/v1/audio/jobs/{bad_id}{suffix}")
                assert response.status_code == 404, (bad_id, suffix)
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        unknown = await client.post("/v1/audio/jobs", json={"input": "Hi.", "voice": "sim", "x": 1})
        assert unknown.status_code == 400
        past = await client.post(
            "/v1/audio/jobs",
            json={"input": "Hi.", "voice": "sim", "finish_by": "2001-01-01T00:00:00Z"},
        )
        assert past.status_code == 400 and past.json()["error"]["param"] == "finish_by"
        # 20,000 characters due in one second: refused at once, the predicted time named
        engine = client.app.state.playhead.engine  # type: ignore[attr-defined]
        now_s = engine._clock()
        engine.talker.rate.record(now_s - 1.0, now_s, 4.0)  # a measured capacity: 4x
        engine.vocoder.rate.record(now_s - 1.0, now_s, 4.0)
        soon = await client.post(
            "/v1/audio/jobs",
            json={"input": "Word. " * 3000, "voice": "sim", "finish_by": _in_seconds(1)},
        )
        assert soon.status_code == 400, soon.text
        error = soon.json()["error"]
        assert error["code"] == "finish_by_unreachable" and "would finish at" in error["message"]


def _in_seconds(seconds: float) -> float:
    return time.time() + seconds


async def test_another_keys_job_is_not_found(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path, "server.api_key=first")) as client:
        mine = {"Authorization": "Bearer first"}
        response = await client.post(
            "/v1/audio/jobs", json={"input": TEXT, "voice": "sim"}, headers=mine
        )
        job_id = response.json()["id"]
        assert (await client.get(f"/v1/audio/jobs/{job_id}", headers=mine)).status_code == 200
        assert (await client.get(f"/v1/audio/jobs/{job_id}")).status_code == 401
    # the key changed: the old key's jobs are nobody else's
    async with asgi_client(_settings(tmp_path, "server.api_key=second")) as client:
        other = {"Authorization": "Bearer second"}
        assert (await client.get(f"/v1/audio/jobs/{job_id}", headers=other)).status_code == 404
        assert (await client.get("/v1/audio/jobs", headers=other)).json()["data"] == []
        response = await client.delete(f"/v1/audio/jobs/{job_id}", headers=other)
        assert response.status_code == 404


async def test_jobs_per_key_and_disk_limits(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path, "jobs.jobs_per_key=2")) as client:
        await _create(client, input="One.")
        await _create(client, input="Two.")
        third = await client.post("/v1/audio/jobs", json={"input": "Three.", "voice": "sim"})
        assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_jobs"
    async with asgi_client(_settings(tmp_path / "b", "jobs.max_disk_gb=0.001")) as client:
        job = await _create(client, input=TEXT * 8)  # ~2 MB of PCM: past 1 MB mid-way
        done = await _wait_done(client, job["id"])
        assert done["state"] == "failed" and "jobs.max_disk_gb" in done["error"]
        audio = await client.get(f"/v1/audio/jobs/{job['id']}/audio")
        assert audio.status_code == 409 and audio.json()["error"]["code"] == "job_failed"
        refused = await client.post("/v1/audio/jobs", json={"input": "More.", "voice": "sim"})
        assert refused.status_code == 507
        # the server goes on: speech still works
        speech = await client.post(
            "/v1/audio/speech", json={"model": "tts-1", "input": "Still here.", "voice": "sim"}
        )
        assert speech.status_code == 200


def test_delete_during_a_download_cuts_it_and_leaves_nothing(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "sim.vocoder_per_frame_ms=3")
    with live_server(settings) as server:
        base = server.base_url
        created = httpx.post(
            f"{base}/v1/audio/jobs",
            json={"input": TEXT * 4, "voice": "sim", "response_format": "pcm"},
            timeout=10,
        )
        job_id = created.json()["id"]
        received = 0
        url = f"{base}/v1/audio/jobs/{job_id}/audio"
        # the body is cut, not passed off as whole
        with pytest.raises(httpx.RemoteProtocolError), httpx.stream("GET", url, timeout=20) as body:
            assert body.status_code == 200
            for part in body.iter_bytes():
                if not received:
                    deleted = httpx.delete(f"{base}/v1/audio/jobs/{job_id}", timeout=10)
                    assert deleted.status_code == 200
                received += len(part)
        assert received > 0
        assert not (tmp_path / "audio" / job_id).exists()
        gone = httpx.get(f"{base}/v1/audio/jobs/{job_id}/audio", timeout=5)
        assert gone.status_code == 404
        engine = server.app.state.playhead.engine
        deadline = time.monotonic() + 5
        while engine.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.in_flight == 0


async def test_a_corrupt_row_and_a_deleted_file_fail_that_job_only(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path)) as client:
        broken = await _create(client, input="This one breaks.")
        lost = await _create(client, input="This one loses its file.")
        fine = await _create(client, input="This one is fine.")
        for job in (broken, lost, fine):
            assert (await _wait_done(client, job["id"]))["state"] == "done"
        with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
            db.execute("UPDATE made SET words = 'not json' WHERE job_id = ?", (broken["id"],))
        for path in (tmp_path / "audio" / lost["id"]).glob("*.pcm"):
            path.unlink()
        corrupt = (await client.get(f"/v1/audio/jobs/{broken['id']}")).json()
        assert corrupt["state"] == "failed" and "corrupt" in corrupt["error"]
        audio = await client.get(f"/v1/audio/jobs/{broken['id']}/audio")
        assert audio.status_code == 409 and "corrupt" in audio.json()["error"]["message"]
        missing = await client.get(f"/v1/audio/jobs/{lost['id']}/audio")
        assert missing.status_code == 409 and "missing" in missing.json()["error"]["message"]
        assert (await client.get(f"/v1/audio/jobs/{fine['id']}/audio")).status_code == 200
    # at the next start the store reconciles: both failed, with their reasons
    async with asgi_client(_settings(tmp_path)) as client:
        states = {j["id"]: j for j in (await client.get("/v1/audio/jobs")).json()["data"]}
        assert states[lost["id"]]["state"] == "failed" and "missing" in states[lost["id"]]["error"]
        assert states[broken["id"]]["state"] == "failed"
        assert states[fine["id"]]["state"] == "done"


async def test_audio_of_pcm_jobs_is_the_engine_audio(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path)) as client:
        job = await _create(client, response_format="pcm", sample_rate=24000)
        await _wait_done(client, job["id"])
        audio = (await client.get(f"/v1/audio/jobs/{job['id']}/audio")).content
        pcm = np.frombuffer(audio, dtype="<i2")
        done = (await client.get(f"/v1/audio/jobs/{job['id']}")).json()
        assert pcm.size == round(done["progress"]["audio_seconds"] * 24000)


async def test_metrics_count_jobs_by_state_and_their_audio(tmp_path: Path) -> None:
    async with asgi_client(_settings(tmp_path)) as client:
        job = await _create(client)
        done = await _wait_done(client, job["id"])
        text = (await client.get("/metrics")).text
        assert 'playhead_jobs{state="done"} 1.0' in text
        assert 'playhead_jobs_ended_total{state="done"} 1.0' in text
        made = metric_value(text, "playhead_job_audio_seconds_total")
        assert made == pytest.approx(done["progress"]["audio_seconds"], abs=0.01)
        assert "playhead_job_capacity_share" in text


async def test_a_jobs_segments_stay_out_of_the_live_figures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job's segments are engine streams, but not live listeners': the TTFA and stall
    metrics, the stream counts, the stream-end log lines, admission's first-audio window
    and the mean live stream (what a new request is predicted to owe) are the live
    request's alone. A job's segment waits for what live listeners leave: in admission's
    first-audio window it would read as a slow start and refuse live requests."""
    live_text = "Hello there, a live listener is here."
    async with asgi_client(_settings(tmp_path)) as client:
        engine = client.app.state.playhead.engine  # type: ignore[attr-defined]
        with caplog.at_level("INFO", logger="playhead"):
            job = await _create(client)
            speech = await client.post(
                "/v1/audio/speech",
                json={
                    "model": "tts-1",
                    "input": live_text,
                    "voice": "sim",
                    "response_format": "pcm",
                },
            )
            assert speech.status_code == 200
            done = await _wait_done(client, job["id"])
        assert done["state"] == "done" and done["progress"]["segments_done"] > 1
        text = (await client.get("/metrics")).text
        table = engine.book.table
    assert metric_value(text, "playhead_ttfa_seconds_count") == 1
    assert metric_value(text, "playhead_streams_total", 'state="done"') == 1
    assert metric_value(text, "playhead_stalls_total") == 0
    live_ttfa_s = metric_value(text, "playhead_ttfa_seconds_sum")
    assert table.first_audio.predict_s() == pytest.approx(live_ttfa_s, abs=1e-9)
    live_audio_s = expected_audio_s(_settings(tmp_path), live_text)
    assert table.mean_stream_audio_s == pytest.approx(live_audio_s, abs=1e-6)
    ends = [r for r in caplog.records if r.levelname == "INFO" and r.name == "playhead.engine"]
    assert len([r for r in ends if r.getMessage().startswith("stream ")]) == 1


async def test_a_form_upload_of_a_markdown_file_makes_a_job(tmp_path: Path) -> None:
    """multipart/form-data as `curl -F file=@book.md -F voice=sim` sends it: the file's
    text, its chapters, the file's name as the title; and what a form must not be."""
    settings = _settings(tmp_path, "jobs.max_request_bytes=65536")
    async with asgi_client(settings) as client:

        async def post(files: dict | None = None, **fields: str) -> httpx.Response:
            return await client.post("/v1/audio/jobs", files=files, data=fields)

        made = await post({"file": ("book.md", MARKDOWN.encode(), "text/markdown")}, voice="sim")
        assert made.status_code == 202, made.text
        job = await _wait_done(client, made.json()["id"])
        assert job["title"] == "book" and job["progress"]["characters"] == len(MARKDOWN)
        assert [c["title"] for c in job["chapters"]][:2] == ["The first part", "A second heading"]
        titled = await post(
            {"file": ("a.txt", b"Plain words.", "text/plain")}, voice="sim", title="Mine"
        )
        assert titled.status_code == 202 and titled.json()["title"] == "Mine"
        as_field = await post(None, voice="sim", input="Text as a field.")
        assert as_field.status_code == 202

        def error(response: httpx.Response) -> tuple[int, str | None, str | None]:
            body = response.json()["error"]
            assert set(body) == {"message", "type", "param", "code"}
            return response.status_code, body["param"], body["code"]

        binary = await post({"file": ("b.txt", bytes(range(256)) * 4, "text/plain")}, voice="sim")
        assert error(binary) == (400, "file", "invalid_file")
        pdf = await post({"file": ("b.pdf", b"%PDF-1.7 words", "application/pdf")}, voice="sim")
        assert error(pdf) == (400, "file", "invalid_file")
        empty = await post({"file": ("e.txt", b"", "text/plain")}, voice="sim")
        assert error(empty)[0] == 400
        assert error(await post(None, voice="sim"))[:2] == (400, "file")
        both = await post({"file": ("a.txt", b"One.", "text/plain")}, voice="sim", input="Two.")
        assert error(both)[:2] == (400, "input")
        bad_speed = await post({"file": ("a.txt", b"One.", "text/plain")}, voice="sim", speed="x")
        assert error(bad_speed)[:2] == (400, "speed")
        big = await post({"file": ("big.txt", b"word " * 20000, "text/plain")}, voice="sim")
        assert error(big)[0] == 413
        broken = await client.post(
            "/v1/audio/jobs",
            content=b"--xyz\r\nnot a part",
            headers={"Content-Type": "multipart/form-data; boundary=xyz"},
        )
        assert broken.status_code == 400
