"""Admission for POST /v1/audio/speech, decided before the framework sees the request.

A burst of requests is refused at the cost of this check, not of FastAPI's routing,
dependencies, body read and exception handling (about 1 ms a request on a small busy
machine, which made the 40th 429 of a burst wait for the 39 before it). The gate asks the
engine for a slot (`Engine.reserve`): refused, it sends the 429 (the envelope and
Retry-After of app/errors.py) at once without reading the body; admitted, the slot rides
in the request's scope to the route, which hands it to `Engine.submit`, and is given back
here if the request ends any other way (a 400 for its body, a client gone). So under
overload a request with a bad body gets 429, not 400: the server refuses work before
reading it.

A request beyond capacity that the engine queued (pipeline/admission.py, the one fair
queue) waits here, in arrival order, before the framework reads its body: it goes on
once granted, gets the 429 "queue_timeout" when its longest wait has passed
(admission.queue_max_wait_s, less under admission.first_audio_bound_s), and the 503
path (the route's) if the engine stops or drains meanwhile. A client that disconnects
while waiting leaves the queue at once: the request's `ClientWatch` (app/disconnect.py),
which the gate installs for the route and the response to share, reads its messages
meanwhile (kept and handed on to the route) to see its `http.disconnect`.

It runs after the drain (503) and the API key (401): those answer first. While the engine
is not ready the route answers (503) as before.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send

from app.disconnect import WATCH_KEY, ClientWatch
from app.errors import error_response, pipeline_api_error
from app.state import AppState
from pipeline import NotReady, Rejected
from pipeline.admission import wait_admitted

SPEECH_PATH = "/v1/audio/speech"
# the scope key of an admitted request's Reservation (pipeline.engine.Reservation)
RESERVATION_KEY = "playhead.reservation"


class AdmissionGate:
    def __init__(self, app: ASGIApp, *, state: AppState) -> None:
        self.app = app
        self._state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != SPEECH_PATH:
            await self.app(scope, receive, send)
            return
        state = self._state
        engine = state.ready_engine
        if engine is None:
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()
        try:
            reservation = engine.reserve()
        except Rejected as exc:
            await error_response(pipeline_api_error(exc))(scope, receive, send)
            state.metrics.rejection_s.observe(time.perf_counter() - started_s)
            return
        except NotReady:  # stopping: the route answers 503
            await self.app(scope, receive, send)
            return
        # the one watch of the request's receive channel (app/disconnect.py): it keeps
        # the body read while waiting, for the route
        watch = ClientWatch(receive, max_kept_bytes=state.settings.server.max_request_bytes + 1)
        scope[WATCH_KEY] = watch
        receive = watch.receive
        try:
            if reservation.queued:
                try:
                    admitted = await wait_admitted(reservation, watch.gone())
                except Rejected as refusal:  # waited its longest wait: 429
                    await error_response(pipeline_api_error(refusal))(scope, receive, send)
                    return
                except NotReady:  # stopping or draining meanwhile: the route answers 503
                    reservation.release()
                    await self.app(scope, receive, send)
                    return
                if not admitted or watch.left:  # the client left: nothing to answer
                    return
            scope[RESERVATION_KEY] = reservation
            await self.app(scope, receive, send)
        finally:
            reservation.release()  # a no-op once the route's submit used it
