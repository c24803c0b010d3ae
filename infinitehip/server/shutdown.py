"""Graceful shutdown: on SIGTERM / Ctrl-C stop accepting, let running requests finish, end the rest cleanly.

uvicorn's own shutdown closes the listening sockets, waits `timeout_graceful_shutdown` for the open requests and
then cancels them: a non-streaming client gets a plain-text 500, a stream is cut without an error event or
`[DONE]`. `DrainingServer` drains first: new requests get 503, running ones get ServerConfig.drain_timeout_s to
finish, then the engine ends the rest with a 503 error (a stream: an error event and `[DONE]`), and only then
uvicorn's shutdown runs (its lifespan end stops the engine loop and saves the prefix cache). The signal is not
raised again afterwards (uvicorn's default, which makes the exit status that of the signal): a drained server
exits 0.
"""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from infinitehip.config.server import ServerConfig
from infinitehip.server.async_engine import AsyncEngine

RESPONSE_GRACE_S = 5.0  # after the drain: ended requests write their last bytes, then uvicorn cancels what is left


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, async_engine: AsyncEngine, drain_timeout_s: float):
        super().__init__(config)
        self.async_engine, self.drain_timeout_s = async_engine, drain_timeout_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's, without recording the signal to raise it again at exit; a second Ctrl-C still forces the exit
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:  # no new connections
            server.close()
        for connection in list(self.server_state.connections):  # idle keep-alive ones close, busy ones after answering
            connection.shutdown()
        if not self.force_exit:
            await self.async_engine.drain(self.drain_timeout_s)
        await super().shutdown(sockets)


def draining_server(app: FastAPI, config: ServerConfig, **uvicorn_options) -> DrainingServer:
    """A server for `app` (create_app's) on config's host and port; serve with .run()."""
    server_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                   timeout_graceful_shutdown=RESPONSE_GRACE_S, **uvicorn_options)
    return DrainingServer(server_config, app.state.async_engine, config.drain_timeout_s)
