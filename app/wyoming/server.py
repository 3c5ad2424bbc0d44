"""The Wyoming TCP listener, in the HTTP server's process and over its engine.

`WyomingServer` is one of the AppState's services (app/state.py): `open()` runs at the
app's startup and binds the port at once (a port in use fails the startup, as uvicorn's
own does), but listens only once the model's loading ended, so that the first `describe`
lists the voices (a client that connects earlier is refused, and Home Assistant retries
its setup); if loading failed, every request gets the error. `close()` at shutdown stops listening
and ends every connection, cancelling its streams, before the engine stops. A graceful
shutdown's drain (app/shutdown.py) covers Wyoming too: new syntheses are refused with an
error event, those in flight go on until the grace ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from app.state import AppState
from app.wyoming.session import Session

logger = logging.getLogger("playhead.wyoming")


class WyomingServer:
    def __init__(self, state: AppState) -> None:
        self._state = state
        self._server: asyncio.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._sessions: dict[asyncio.Task[None], Session] = {}
        self._closed = False
        self._socket: socket.socket | None = None  # bound by `bind`, listened on by `open`

    @property
    def listening(self) -> bool:
        """Whether connections are being accepted (from the end of loading to shutdown)."""
        return self._server is not None and self._server.is_serving()

    @property
    def connections(self) -> int:
        """Connections being served."""
        return len(self._sessions)

    def bind(self) -> None:
        """Bind the port now, before the server starts (`playhead serve`): a port in use is
        then the CLI's one line, not a failed startup's traceback. OSError, with a sentence
        that names the address, otherwise."""
        config = self._state.settings.wyoming
        try:
            self._socket = socket.create_server((config.host, config.port))
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise OSError(
                exc.errno, f"cannot listen for Wyoming on {config.host}:{config.port}: {why}"
            ) from None

    async def open(self) -> None:
        self._closed = False
        config = self._state.settings.wyoming
        bound, self._socket = self._socket, None
        try:
            if bound is not None:
                self._server = await asyncio.start_server(
                    self._accept, sock=bound, limit=config.max_line_bytes, start_serving=False
                )
            else:
                self._server = await asyncio.start_server(
                    self._accept,
                    host=config.host,
                    port=config.port,
                    limit=config.max_line_bytes,
                    start_serving=False,
                )
        except OSError as exc:
            raise RuntimeError(
                f"cannot listen for Wyoming on {config.host}:{config.port}: {exc.strerror or exc}"
            ) from exc
        self._serving = asyncio.create_task(self._serve_when_loaded(), name="playhead-wyoming")

    async def _serve_when_loaded(self) -> None:
        assert self._server is not None
        await self._state.wait_loaded()
        await self._server.start_serving()
        config = self._state.settings.wyoming
        logger.info("Wyoming on tcp://%s:%d", config.host, config.port)
        if self._state.settings.server.api_key is not None:
            logger.warning(
                "the Wyoming port has no authentication (the protocol has none): "
                "server.api_key does not protect it"
            )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection's task (asyncio's own). Not cancelled at shutdown but stopped
        through its Session: asyncio 3.11 logs a cancelled connection task as an error."""
        task = asyncio.current_task()
        assert task is not None
        if self._closed:  # accepted just before the listener closed
            writer.close()
            return
        session = Session(reader, writer, self._state)
        self._sessions[task] = session
        try:
            await session.run()
        except Exception:
            logger.exception("wyoming: the connection failed")
        finally:
            del self._sessions[task]

    async def close(self) -> None:
        self._closed = True
        serving, self._serving = self._serving, None
        if serving is not None:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._sessions)
        for session in self._sessions.values():
            session.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
