"""OpenAI-compatible HTTP server: `create_app(engine, server_config)` (see app.py)."""

from infinitehip.server.app import create_app

__all__ = ["create_app"]
