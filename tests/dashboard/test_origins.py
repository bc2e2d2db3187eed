"""The WebSocket Origin check accepts the proxy's public origin even when the proxy
forwards a private Host (so the public name is not in ALLOWED_HOSTS)."""

import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from dashboard.origins import OriginCheck


class Accept(AsyncWebsocketConsumer):
    async def connect(self):
        await self.accept()


async def opens(origin):
    app = OriginCheck(Accept.as_asgi())
    ws = WebsocketCommunicator(app, "/ws/runs/", headers=[(b"origin", origin.encode()), (b"host", b"127.0.0.1")])
    ok, _ = await ws.connect(timeout=5)
    await ws.disconnect()
    return ok


@pytest.mark.asyncio
@override_settings(ALLOWED_HOSTS=["127.0.0.1"], CSRF_TRUSTED_ORIGINS=["https://runwarden.example"])
async def test_trusted_origin_is_accepted_with_its_scheme_only():
    assert await opens("https://runwarden.example")
    assert await opens("http://127.0.0.1:8000")  # ALLOWED_HOSTS, as before
    assert not await opens("http://runwarden.example")  # not the trusted scheme
    assert not await opens("https://evil.example")


@pytest.mark.asyncio
@override_settings(ALLOWED_HOSTS=["127.0.0.1"], CSRF_TRUSTED_ORIGINS=[])
async def test_without_trusted_origins_the_public_origin_is_refused():
    assert not await opens("https://runwarden.example")


@pytest.mark.asyncio
@override_settings(ALLOWED_HOSTS=["127.0.0.1"], CSRF_TRUSTED_ORIGINS=["https://*.runwarden.example"])
async def test_wildcard_trusted_origin_covers_subdomains():
    assert await opens("https://eu.runwarden.example")
    assert not await opens("https://runwarden.example.evil")
