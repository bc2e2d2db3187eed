"""A headless viewer of a run page, for the benchmarks and the scale test: it connects
to `/ws/runs/<id>/` as a logged-in browser does (session cookie, Origin) and rebuilds
from the pushed fragments what the page shows: the committed steps and the in-flight
text. Not used by the product.
"""

import asyncio
import html
import re
import time

IN_FLIGHT_BLOCK = re.compile(r'<div id="inflight"[^>]*data-step="(\d+)".*?<pre id="inflight-text"[^>]*>(.*?)</pre>', re.S)
IN_FLIGHT_APPEND = re.compile(r'<span id="inflight-text" hx-swap-oob="beforeend">(.*?)</span>', re.S)
STEP = re.compile(r'<li id="step-(\d+)" class="step">(.*?)</li>', re.S)
STEP_TEXT = re.compile(r'<pre class="stream">(.*?)</pre>', re.S)


class RunPageViewer:
    """`frames` counts every frame; `text_frames` those carrying streamed text.
    `steps[i]` is committed step i's text as rendered; `streamed[i]` what streamed in
    for step i before it was committed. `on_text(text, at)` sees each new piece."""

    def __init__(self, base, run_id, cookie, *, origin=None, on_text=None):
        self.url = f"{base}/ws/runs/{run_id}/"
        self.run_id = str(run_id)
        # A browser's Origin is the page's own: the server's scheme, host and port.
        origin = origin or base.replace("wss://", "https://", 1).replace("ws://", "http://", 1)
        self.headers = {"Origin": origin, "Cookie": cookie}
        self.on_text = on_text
        self.frames = self.text_frames = self.resyncs = 0
        self.steps, self.streamed = {}, {}
        self.step, self.text = None, ""
        self._streaming = {}  # step -> its in-flight text so far
        self.ws = None
        self.updated = asyncio.Event()  # set on every frame: wait for a page state, never sleep

    async def until(self, condition, timeout):
        """Wait (at most `timeout` s) until `condition()` holds for what the page shows."""
        async with asyncio.timeout(timeout):
            while not condition():
                self.updated.clear()
                await self.updated.wait()

    async def connect(self, timeout=30):
        import websockets

        self.ws = await websockets.connect(self.url, additional_headers=self.headers, max_queue=None,
                                           open_timeout=timeout)
        return self

    async def read(self):
        """Until the socket closes (or this task is cancelled)."""
        import websockets

        try:
            async for frame in self.ws:
                self.feed(frame, time.monotonic())
        except websockets.ConnectionClosed:
            pass

    async def close(self):
        if self.ws is not None:
            await self.ws.close()

    def feed(self, frame, at):
        self.frames += 1
        fresh = "".join(html.unescape(m) for m in IN_FLIGHT_APPEND.findall(frame))
        if fresh:
            self.text += fresh
            self._streaming[self.step] = self.text
        for index, body in STEP.findall(frame):
            text = STEP_TEXT.search(body)
            self.steps[int(index)] = html.unescape(text.group(1)) if text else ""
            # The next step may have begun streaming before this one's commit was
            # rendered (they travel apart): what streamed is kept per step.
            if int(index) in self._streaming:
                self.streamed[int(index)] = self._streaming[int(index)]
        block = IN_FLIGHT_BLOCK.search(frame)
        if block:
            step, text = int(block.group(1)), html.unescape(block.group(2))
            if text:
                self.resyncs += 1
                fresh = text  # a resync: the whole in-flight text so far
            self.step, self.text = step, text
            if text:
                self._streaming[step] = text
        if fresh:
            self.text_frames += 1
            if self.on_text is not None:
                self.on_text(fresh, at)
        self.updated.set()
