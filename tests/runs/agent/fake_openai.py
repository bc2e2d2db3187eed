"""A fake OpenAI-compatible server on 127.0.0.1, raw asyncio: each request takes the
next scripted response. Records what it was sent; knows when a client hung up."""

import asyncio
import json
import time


def sse(*chunks, usage=None):
    """Stream events for text chunks (str) and tool-call fragments (dict)."""
    events = []
    for chunk in chunks:
        delta = {"content": chunk} if isinstance(chunk, str) else {"tool_calls": [chunk]}
        events.append({"choices": [{"index": 0, "delta": delta}]})
    if usage:
        events.append({"choices": [], "usage": usage})
    return events


class FakeOpenAI:
    def __init__(self, responses):
        self.responses = list(responses)  # ("stream", events, hold_after) | ("status", code, headers) | ("json", body)
        self.requests = []  # (headers, body)
        self.arrived = []  # monotonic time of each request
        self.answered = asyncio.Event()  # an error status was sent
        self.held = asyncio.Event()  # a stream stopped mid-way, as scripted
        self.hung_up = asyncio.Event()  # the client closed a held stream
        self.server = None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    @property
    def gaps(self):
        """Seconds between each request and the one before it (first: 0)."""
        return [0.0] + [b - a for a, b in zip(self.arrived, self.arrived[1:])]

    @property
    def base_url(self):
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}/v1"

    async def _handle(self, reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            body = json.loads(await reader.readexactly(int(headers.get("content-length", 0))))
            self.requests.append((headers, body))
            self.arrived.append(time.monotonic())
            kind, *args = self.responses.pop(0)
            await getattr(self, f"_{kind}")(reader, writer, *args)
        finally:
            writer.close()

    async def _status(self, reader, writer, code, extra=None):
        payload = b'{"error": {"message": "scripted"}}'
        head = f"HTTP/1.1 {code} Err\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        for name, value in (extra or {}).items():
            head += f"{name}: {value}\r\n"
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + payload)
        await writer.drain()
        self.answered.set()

    async def _json(self, reader, writer, body):
        payload = json.dumps(body).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        )
        await writer.drain()

    async def _stream(self, reader, writer, events, hold_after=None):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for i, event in enumerate(events):
            if hold_after is not None and i == hold_after:
                self.held.set()
                await reader.read()  # returns b"" when the client hangs up
                self.hung_up.set()
                return
            writer.write(f"data: {json.dumps(event)}\n\n".encode())
            await writer.drain()
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
