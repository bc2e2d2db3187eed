"""The WebSocket Origin check: our own origin to the port (as the request reached us,
through a trusted proxy's headers when the settings say so), or a trusted origin."""

import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from dashboard.origins import OriginCheck

pytestmark = pytest.mark.asyncio


class Accept(AsyncWebsocketConsumer):
    async def connect(self):
        await self.accept()


async def opens(origin, host="127.0.0.1", **headers):
    app = OriginCheck(Accept.as_asgi())
    sent = [(b"origin", origin.encode()), (b"host", host.encode())]
    sent += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    ws = WebsocketCommunicator(app, "/ws/runs/", headers=sent)
    ok, _ = await ws.connect(timeout=5)
    await ws.disconnect()
    return ok


@override_settings(ALLOWED_HOSTS=["127.0.0.1"], CSRF_TRUSTED_ORIGINS=["https://runwarden.example"])
async def test_trusted_origin_is_accepted_with_its_scheme_only():
    assert await opens("https://runwarden.example")
    assert await opens("http://127.0.0.1:8000", host="127.0.0.1:8000")  # our own origin
    assert not await opens("http://runwarden.example")  # not the trusted scheme
    assert not await opens("https://runwarden.example:8443")  # nor its port
    assert not await opens("https://evil.example")


@override_settings(ALLOWED_HOSTS=["127.0.0.1"], CSRF_TRUSTED_ORIGINS=[])
async def test_another_port_of_our_host_is_refused():
    assert not await opens("http://127.0.0.1:9999", host="127.0.0.1:8000")
    assert not await opens("http://127.0.0.1:9999")
    assert not await opens("http://127.0.0.1", host="127.0.0.1:8000")
    assert await opens("http://127.0.0.1:80")  # the default port, spelt out


@override_settings(ALLOWED_HOSTS=["127.0.0.1"], CSRF_TRUSTED_ORIGINS=[])
async def test_without_trusted_origins_the_public_origin_is_refused():
    assert not await opens("https://runwarden.example")


@override_settings(ALLOWED_HOSTS=["127.0.0.1"], CSRF_TRUSTED_ORIGINS=["https://*.runwarden.example"])
async def test_wildcard_trusted_origin_covers_subdomains():
    assert await opens("https://eu.runwarden.example")
    assert not await opens("https://runwarden.example.evil")
    assert not await opens("https://eu.runwarden.example:444")


@override_settings(ALLOWED_HOSTS=["runwarden.example"], CSRF_TRUSTED_ORIGINS=[],
                   SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"), USE_X_FORWARDED_HOST=True)
async def test_a_trusted_proxys_headers_say_what_our_origin_is():
    forwarded = {"x_forwarded_proto": "https", "x_forwarded_host": "runwarden.example"}
    assert await opens("https://runwarden.example", host="10.0.0.5:8000", **forwarded)
    assert not await opens("http://runwarden.example", host="10.0.0.5:8000", **forwarded)
    assert not await opens("https://runwarden.example:9999", host="10.0.0.5:8000", **forwarded)
    assert not await opens("https://runwarden.example", host="runwarden.example")  # no proto header: http


@override_settings(ALLOWED_HOSTS=["runwarden.example", "127.0.0.1"], CSRF_TRUSTED_ORIGINS=[])
async def test_forwarded_headers_are_ignored_unless_the_settings_trust_them():
    assert not await opens("https://runwarden.example", host="127.0.0.1",
                           x_forwarded_proto="https", x_forwarded_host="runwarden.example")
