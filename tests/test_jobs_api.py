"""/v1/audio/jobs on the sim backend, in process: create, list, get, audio (followed while
it renders, the same bytes as the final file, byte ranges, a resumed download),
timestamps, chapters, delete, and hostile input (a body too large, a binary file, ids that
are not jobs, another key's job, DELETE during a download, a finish_by that cannot be met,
the disk limit, a corrupt row, an audio file deleted underneath)."""

from __future__ import annotations

import asyncio
import contextlib
import os
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


def _open_paths(fragment: str) -> list[str]:
    """The paths this process holds open that contain `fragment`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            path = os.readlink(f"/proc/self/fd/{fd}")
            if fragment in path:
                found.append(path)
    return found


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
        assert _open_paths(job_id) == []  # no file of the job is left open


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


async def test_a_jobs_streams_stay_out_of_the_live_listeners_metrics(tmp_path: Path) -> None:
    """A job's segments are engine streams, but not live listeners: their first audio, stalls
    and ends are the job's (its own metrics), never in playhead_ttfa_seconds or the stream
    counters that operators read as the live service."""
    async with asgi_client(_settings(tmp_path)) as client:
        job = await _create(client)
        done = await _wait_done(client, job["id"])
        assert done["state"] == "done" and done["progress"]["segments"] > 1
        text = (await client.get("/metrics")).text
        assert metric_value(text, "playhead_ttfa_seconds_count") == 0
        assert metric_value(text, "playhead_streams_started_total") == 0
        assert metric_value(text, "playhead_streams_total", 'state="done"') == 0
        assert metric_value(text, "playhead_stalls_total") == 0
        speech = await client.post(
            "/v1/audio/speech", json={"model": "tts-1", "input": "A live one.", "voice": "sim"}
        )
        assert speech.status_code == 200
        text = (await client.get("/metrics")).text
        assert metric_value(text, "playhead_ttfa_seconds_count") == 1  # the live one counts
        assert metric_value(text, "playhead_streams_started_total") == 1


async def test_a_file_uploaded_as_multipart_form_data(tmp_path: Path) -> None:
    """POST /v1/audio/jobs with the file in the `file` field and the options as form fields;
    a binary file, an empty one, one past the text limit, and a form without a file: each
    a clear error in OpenAI's envelope."""
    settings = _settings(tmp_path, "jobs.max_text_chars=2000")
    async with asgi_client(settings) as client:
        response = await client.post(
            "/v1/audio/jobs",
            files={"file": ("notes.md", MARKDOWN.encode(), "text/markdown")},
            data={"voice": "sim", "response_format": "wav", "speed": "1.25", "title": "Notes"},
        )
        assert response.status_code == 202, response.text
        job = response.json()
        assert job["title"] == "Notes" and job["progress"]["characters"] == len(MARKDOWN)
        assert [c["title"] for c in job["chapters"]][:2] == ["The first part", "A second heading"]
        done = await _wait_done(client, job["id"])
        assert done["state"] == "done"

        async def upload(content: bytes, **fields: str) -> httpx.Response:
            return await client.post(
                "/v1/audio/jobs",
                files={"file": ("book.txt", content, "text/plain")},
                data={"voice": "sim", **fields},
            )

        for content in (bytes(range(256)) * 8, b"text\x00more", "é".encode("latin-1")):
            bad = await upload(content)
            assert bad.status_code == 400, content[:10]
            assert bad.json()["error"]["param"] == "file"
            assert set(bad.json()["error"]) == {"message", "type", "param", "code"}
        named = await upload(b"Plain words.")  # no title: the file's name without .txt
        assert named.status_code == 202 and named.json()["title"] == "book"
        empty = await upload(b"")
        assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
        over = await upload(b"word " * 401)  # 2005 characters
        assert over.status_code == 413 and over.json()["error"]["code"] == "file_too_large"
        huge = await upload(b"a" * (4 * 2000 + 70 * 1024))  # past what 2000 chars can take
        assert huge.status_code == 413, huge.text
        bad_speed = await upload(b"Hello there.", speed="fast")
        assert bad_speed.status_code == 400 and bad_speed.json()["error"]["param"] == "speed"
        no_file = await client.post(
            "/v1/audio/jobs", data={"voice": "sim"}, files={"other": ("a.txt", b"Hi.")}
        )
        assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "other"
        as_field = await client.post(
            "/v1/audio/jobs",
            content=b"--b\r\nContent-Disposition: form-data; name=file\r\n\r\nHi.\r\n--b--\r\n",
            headers={"Content-Type": "multipart/form-data; boundary=b"},
        )
        assert as_field.status_code == 400 and as_field.json()["error"]["param"] == "file"
        torn = await client.post(
            "/v1/audio/jobs",
            content=b"not a multipart body",
            headers={"Content-Type": "multipart/form-data"},
        )
        assert torn.status_code == 400 and torn.json()["error"]["code"] == "invalid_form"


async def test_more_hostile_input(tmp_path: Path) -> None:
    """A malformed finish_by, an unknown voice or format: 400 naming the field; a job id
    that is not one and another key's job: the same 404 (no existence leak)."""
    async with asgi_client(_settings(tmp_path, "server.api_key=first")) as client:
        mine = {"Authorization": "Bearer first"}
        for field, value in (
            ("finish_by", "tomorrow at noon"),
            ("finish_by", "2030-13-45T99:00:00Z"),
            ("finish_by", float("nan")),
            ("voice", "no-such-voice"),
            ("response_format", "midi"),
            ("speed", -1),
        ):
            body: dict[str, object] = {"input": "Hello there.", "voice": "sim", field: value}
            if value != value:  # NaN: JSON has no such number; send the literal
                raw = b'{"input": "Hello there.", "voice": "sim", "finish_by": NaN}'
                response = await client.post(
                    "/v1/audio/jobs",
                    content=raw,
                    headers={**mine, "Content-Type": "application/json"},
                )
            else:
                response = await client.post("/v1/audio/jobs", json=body, headers=mine)
            assert response.status_code == 400, (field, value, response.text)
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            if value != value:  # a clear error, if not about the field: JSON has no NaN
                assert error["code"] == "invalid_json" and "NaN" in error["message"]
            else:
                assert field in (error["param"] or "") or field in error["message"], error
        job = await client.post(
            "/v1/audio/jobs", json={"input": TEXT, "voice": "sim"}, headers=mine
        )
        job_id = job.json()["id"]
    async with asgi_client(_settings(tmp_path, "server.api_key=second")) as client:
        other = {"Authorization": "Bearer second"}
        for suffix in ("", "/audio", "/timestamps"):
            theirs = await client.get(f"/v1/audio/jobs/{job_id}{suffix}", headers=other)
            fake_id = "job_" + "B" * (len(job_id) - 4)
            none = await client.get(f"/v1/audio/jobs/{fake_id}{suffix}", headers=other)
            assert theirs.status_code == none.status_code == 404
            assert theirs.json()["error"]["message"].replace(job_id, "ID") == none.json()["error"][
                "message"
            ].replace(fake_id, "ID")


async def test_a_body_without_a_length_is_cut_at_the_limit(tmp_path: Path) -> None:
    """A chunked body (no Content-Length) is counted as it arrives: 413 once it passes
    the limit, the rest unread, as text/plain and as a form."""
    settings = _settings(tmp_path, "jobs.max_request_bytes=65536")
    sent: list[int] = []

    async def pieces(head: bytes = b""):
        yield head
        for _ in range(64):
            sent.append(1)
            yield b"word " * 2000  # 10 kB a piece, 640 kB in all

    async with asgi_client(settings) as client:
        plain = await client.post(
            "/v1/audio/jobs?voice=sim", content=pieces(), headers={"Content-Type": "text/plain"}
        )
        assert plain.status_code == 413 and "Content-Length" not in plain.request.headers
        assert len(sent) < 64  # cut where it passed the limit, not read to its end
        sent.clear()
        head = b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\n'
        form = await client.post(
            "/v1/audio/jobs",
            content=pieces(head),
            headers={"Content-Type": "multipart/form-data; boundary=xyz"},
        )
        assert form.status_code == 413 and len(sent) < 64
