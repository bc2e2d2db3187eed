"""Request bodies past RUNWARDEN_MAX_BODY_BYTES are refused with 413 before they are read.

Two guards, because the server reads before the application can refuse:

- `guard_daphne()`: daphne (through Twisted) reads a whole request body into a temporary
  file and then queues all of it, in memory, for the application, before the
  application runs (daphne/http_protocol.py `WebRequest.process`). So a 1 GiB POST grew
  the server by about 1 GiB whatever the application did. The guard is daphne's request
  class with a limit: a Content-Length over it, or a chunked body that runs past it, is
  answered 413 at once; the connection is half-closed and no more of the body is read.
- `BodyLimit`: the same rule at the ASGI level, for any other ASGI server (and as a
  second line): 413 for a Content-Length over the limit without calling `receive`, and
  413 for a streamed body that runs past it, before Django buffers it.

The agent API's own 1 MiB batch limit sits below this one and answers in its JSON shape.
"""

import json
import logging

log = logging.getLogger("dashboard.limits")
LINGER_S = 2.0  # after the 413, how long the client may take to read it before we close


def _answer(path, limit):
    """(content type, body) of the 413 for a request to `path`."""
    message = f"the request body is larger than {limit} bytes"
    if path.startswith(("/api/", "/metrics")):
        body = json.dumps({"error": {"code": "too_large", "message": message, "fields": {}}})
        return b"application/json", body.encode()
    return b"text/plain; charset=utf-8", (message + "\n").encode()


def _content_length(headers):
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """ASGI middleware: refuse HTTP request bodies over `limit` bytes with 413."""

    def __init__(self, app, limit):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = _content_length(scope.get("headers", ()))
        if length is not None and length > self.limit:
            log.warning("refused a %d-byte body to %s (limit %d)", length, scope.get("path", ""), self.limit)
            return await self._refuse(scope, send)
        state = {"received": 0, "refused": False, "started": False}

        async def limited_receive():
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.limit and not state["refused"]:
                    state["refused"] = True
                    log.warning("refused a streamed body past %d bytes to %s", self.limit, scope.get("path", ""))
                    if not state["started"]:
                        await self._refuse(scope, send)
                    # The application sees the client leave and stops reading.
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if state["refused"]:
                return  # our 413 is the answer; drop whatever the application still sends
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        return await self.app(scope, limited_receive, guarded_send)

    async def _refuse(self, scope, send):
        content_type, body = _answer(scope.get("path", ""), self.limit)
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]})
        await send({"type": "http.response.body", "body": body})


def guard_daphne(limit):
    """Make daphne refuse bodies over `limit` while it reads them (see the module doc).
    Replaces the request class daphne's HTTP factory builds; idempotent."""
    from daphne import http_protocol
    from twisted.internet import reactor

    base = getattr(http_protocol, "_runwarden_unlimited", http_protocol.WebRequest)

    class LimitedWebRequest(base):
        max_body = limit

        def gotLength(self, length):
            self._received = 0
            self._refused = False
            if length is not None and length > self.max_body:
                return self._refuse(f"a {length}-byte body")
            return super().gotLength(length)

        def handleContentChunk(self, data):
            if self._refused:
                return
            self._received += len(data)
            if self._received > self.max_body:
                return self._refuse(f"a streamed body past {self.max_body} bytes")
            return super().handleContentChunk(data)

        def requestReceived(self, command, path, version):
            if self._refused:
                return  # answered already; the application never sees it
            return super().requestReceived(command, path, version)

        def _refuse(self, what):
            self._refused = True
            path = getattr(self.channel, "_path", b"") or b""
            path = path.decode("latin-1").split("?", 1)[0]
            peer = getattr(self.getClientAddress(), "host", None) or "a unix socket"
            log.warning("refused %s to %s from %s (limit %d)", what, path, peer, self.max_body)
            # No "100 Continue" after our answer: Twisted would send one next.
            self.requestHeaders.removeHeader(b"expect")
            content_type, body = _answer(path, self.max_body)
            transport = self.channel.transport
            transport.write(
                b"HTTP/1.1 413 Content Too Large\r\nContent-Type: " + content_type
                + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
            )
            # Stop reading: the rest of the body stays with the client. Half-close so it
            # sees the answer and the end, then drop the connection after a moment
            # (closing at once with unread data would reset it before the 413 is read).
            transport.pauseProducing()
            if hasattr(transport, "loseWriteConnection"):
                transport.loseWriteConnection()
            reactor.callLater(LINGER_S, transport.abortConnection)

    http_protocol._runwarden_unlimited = base
    http_protocol.WebRequest = LimitedWebRequest
