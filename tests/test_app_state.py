"""The app's structure: routes reach the state without the composition root, and the
pipeline's exceptions become API errors in one function."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
from api_support import sim_settings
from fastapi import FastAPI
from starlette.requests import Request

from app.errors import (
    ApiError,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    pipeline_api_error,
    to_api_error,
)
from app.state import AppState, find_app_state, get_state
from pipeline.errors import NotReady, PipelineError, Rejected, StreamFailed, UnknownVoice
from scheduling import Decision

ROOT = Path(__file__).resolve().parent.parent


def test_routes_do_not_import_the_composition_root():
    code = (
        "import sys, app.routes, app.state, app.streaming\n"
        "assert 'app.server' not in sys.modules, 'app.server was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _request(app: FastAPI) -> Request:
    return Request({"type": "http", "app": app, "headers": []})


def test_get_state_returns_the_attached_state_and_refuses_a_bare_app():
    from app.server import create_app
    from app.settings import Settings

    app = create_app(Settings())
    state = get_state(_request(app))
    assert isinstance(state, AppState)
    assert state.backend is None and state.engine is None and not state.ready
    with pytest.raises(RuntimeError, match="no AppState"):
        get_state(_request(FastAPI()))


def test_rejected_is_a_429_with_the_decisions_retry_after():
    error = pipeline_api_error(Rejected(Decision(accept=False, retry_after_s=7, reason="capacity")))
    assert isinstance(error, RateLimited)
    assert (error.status_code, error.code, error.headers) == (
        429,
        "rate_limit_exceeded",
        {"Retry-After": "7"},
    )
    assert "capacity" in error.message


def test_unknown_voice_is_a_400_on_the_voice_listing_the_available_ones():
    error = pipeline_api_error(UnknownVoice("nobody", ["a", "b"]))
    assert isinstance(error, InvalidRequest)
    assert (error.status_code, error.param, error.code) == (400, "voice", "voice_not_found")
    assert "nobody" in error.message and "a, b" in error.message


def test_not_ready_is_a_503():
    error = pipeline_api_error(NotReady("stopping"))
    assert isinstance(error, ServiceUnavailable)
    assert (error.status_code, error.code) == (503, "engine_not_ready")


def test_stream_failed_is_a_500_naming_the_cause():
    error = pipeline_api_error(StreamFailed("s1", RuntimeError("the talker broke")))
    assert (error.status_code, error.error_type, error.code) == (
        500,
        "server_error",
        "stream_failed",
    )
    assert "the talker broke" in error.message


def test_any_other_pipeline_error_is_a_500_and_the_handler_uses_the_same_mapping():
    class Odd(PipelineError):
        pass

    error = pipeline_api_error(Odd("odd"))
    assert type(error) is ApiError and error.status_code == 500
    rejected = Rejected(Decision(accept=False, retry_after_s=3, reason="max_streams"))
    assert to_api_error(rejected).envelope() == pipeline_api_error(rejected).envelope()


class _Cycle:
    """An object in a reference cycle: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


@pytest.mark.parametrize("freeze", [True, False])
async def test_the_heap_alive_at_load_is_frozen_until_shutdown(freeze: bool) -> None:
    from app.server import create_app

    settings = sim_settings(f"server.freeze_heap_after_load={str(freeze).lower()}")
    app = create_app(settings)
    state = find_app_state(app)
    assert state is not None
    startup = _Cycle()  # alive while the model loads, garbage afterwards
    alive = weakref.ref(startup)
    frozen_before = gc.get_freeze_count()
    async with state.lifespan(app):
        await state.wait_loaded()
        assert state.ready
        del startup
        gc.collect()
        timed = state.metrics.registry.get_sample_value(
            "playhead_gc_pause_seconds_count", {"generation": "2"}
        )
        assert timed is not None and timed >= 1  # the app times its collections
        if freeze:  # a full collection no longer looks at it: it stays
            assert gc.get_freeze_count() > frozen_before
            assert alive() is not None
        else:
            assert gc.get_freeze_count() == frozen_before
            assert alive() is None
    # shut down: the frozen heap is collectable again
    gc.collect()
    assert alive() is None
    assert gc.get_freeze_count() == 0
