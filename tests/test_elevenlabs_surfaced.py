"""What the ElevenLabs clients themselves report when Playhead refuses them (sim backend):
LiveKit fails a context the server is too busy for with the server's error, pipecat
reports a refused key as an ErrorFrame. The clients run unmodified."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import websockets
from api_support import SLOW_TALKER, live_server, sim_settings

KEY = "sk-test-key"


def test_livekit_fails_a_refused_context_with_the_servers_error() -> None:
    from livekit.agents import APIConnectOptions, APIError
    from livekit.plugins import elevenlabs

    with live_server(sim_settings(*SLOW_TALKER, "admission.max_streams=1")) as live:
        socket_url = live.base_url.replace("http://", "ws://")
        socket_url += "/v1/text-to-speech/sim/multi-stream-input?output_format=pcm_24000"

        async def run() -> BaseException:
            async with websockets.connect(socket_url) as holder:
                await holder.send(json.dumps({"text": "Held open. ", "context_id": "held"}))
                while not json.loads(await holder.recv()).get("audio"):
                    pass  # the engine is full
                async with aiohttp.ClientSession() as session:
                    tts = elevenlabs.TTS(
                        voice_id="sim",
                        api_key="any",
                        base_url=live.base_url + "/v1",
                        http_session=session,
                        encoding="pcm_24000",
                    )
                    stream = tts.stream(conn_options=APIConnectOptions(max_retry=0))
                    stream.push_text("Refused here. ")
                    stream.end_input()
                    with pytest.raises(APIError) as failed:
                        async for _ in stream:
                            pass
                    await tts.aclose()
                    return failed.value

        error = asyncio.run(run())
        cause = error.__cause__
        assert isinstance(cause, APIError) and cause.message == "too_many_concurrent_requests"


def test_pipecat_reports_a_refused_key() -> None:
    from pipecat.frames.frames import ErrorFrame, TTSSpeakFrame
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
    from pipecat.tests.utils import SleepFrame, run_test

    with live_server(sim_settings(f"server.api_key={KEY}")) as live:
        service = ElevenLabsTTSService(
            api_key="wrong",
            url=live.base_url.replace("http://", "ws://"),
            sample_rate=24000,
            settings=ElevenLabsTTSService.Settings(voice="sim"),
        )
        frames = [TTSSpeakFrame("Hello there."), SleepFrame(sleep=0.5)]
        _, up = asyncio.run(run_test(service, frames_to_send=frames))
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    assert errors and "HTTP 401" in errors[0].error
