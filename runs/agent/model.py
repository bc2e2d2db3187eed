"""One model call of the loop: gate, stream, fallback, retries, breaker.

Checkpoints owned here (numbers as in the table in `runs.agent.loop`):
  2  a non-streaming call is raced against the signal
  3  every stream event poll is raced against the signal and the stream deadlines
  4  the provider's rate gate (a wait before each request) is cancel-aware
  5  the non-streaming fallback after a stream failure polls the signal on entry
  9  retry backoff sleeps are cancel-aware

A cancel short-circuits before any failure bookkeeping: a `ProviderError` seen while
the signal is fired becomes `Cancelled`, never feeds the breaker, never counts as a
stream failure and is never retried.
"""

import logging
import random

from runs.agent.cancel import Cancelled
from runs.agent.providers.base import CircuitOpen, ProviderError, Reply, StreamStalled
from runs.agent.racing import Racer, sleep

log = logging.getLogger(__name__)


class ModelCaller:
    """Calls `provider` for one run; `on_text(chunk)` receives streamed text and
    `on_restart()` says the streamed text so far is void (a fallback answers anew)."""

    def __init__(self, provider, *, signal, config, breaker, stats, on_text, on_restart):
        self.provider = provider
        self.signal = signal
        self.config = config
        self.breaker = breaker
        self.stats = stats
        self.on_text = on_text
        self.on_restart = on_restart

    async def call(self, request):
        """The model's reply, or raises Cancelled, or ProviderError after the retries."""
        last = None
        for attempt in range(self.config.retries + 1):
            if attempt:
                await sleep(self.signal, self._backoff(attempt, last))  # checkpoint 9
            if not self.breaker.allow():
                raise CircuitOpen(f"circuit open for provider {self.provider.name}")
            try:
                reply = await self._attempt(request)
            except ProviderError as error:
                if self.signal.is_cancelled():
                    raise Cancelled() from None  # a cancel is not a failure
                self.breaker.record_failure()
                self.stats.provider_failures += 1
                log.warning("provider %s failed (attempt %d): %s", self.provider.name, attempt + 1, error)
                last = error
                if not error.retryable:
                    break
                continue
            self.breaker.record_success()
            return reply
        raise last

    async def _attempt(self, request):
        await sleep(self.signal, self.provider.gate())  # checkpoint 4: the rate gate
        if not self.provider.streaming:
            return await self._complete(request)
        try:
            return await self._stream(request)
        except ProviderError as error:
            if self.signal.is_cancelled():
                raise Cancelled() from None
            if error.answered:  # a 429 or a 4xx is the server's answer, not a broken stream
                raise
            self.stats.stream_failures += 1
            log.info("stream from %s failed (%s); falling back to a plain request", self.provider.name, error)
        self.signal.raise_if_cancelled()  # checkpoint 5: the rescue is never sent
        self.on_restart()
        return await self._complete(request)

    async def _complete(self, request):
        async with Racer(self.signal) as racer:  # checkpoint 2
            try:
                return await racer.run(self.provider.complete(request), timeout=self.config.request_timeout_s)
            except TimeoutError:
                raise ProviderError("provider request timed out", error_class="RequestTimeout") from None

    async def _stream(self, request):
        events = self.provider.stream(request)
        timeout = self.config.stream_first_event_s
        try:
            async with Racer(self.signal) as racer:
                while True:
                    try:  # checkpoint 3: every event poll
                        event = await racer.run(anext(events), timeout=timeout)
                    except TimeoutError:
                        raise StreamStalled("no stream event before the deadline", error_class="StreamStalled") from None
                    except StopAsyncIteration:
                        raise ProviderError("stream ended without a reply", error_class="TruncatedStream") from None
                    if isinstance(event, Reply):
                        return event
                    self.on_text(event)
                    timeout = self.config.stream_idle_s
        finally:
            await _aclose(events)

    def _backoff(self, attempt, error):
        """Exponential backoff with full jitter, and never sooner than the provider's
        Retry-After (up to `retry_after_max_s`): asking earlier only earns another 429."""
        ceiling = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** (attempt - 1))
        delay = random.uniform(ceiling / 2, ceiling)
        if error is not None and error.retry_after:
            delay = max(delay, min(error.retry_after, self.config.retry_after_max_s))
        return delay


async def _aclose(events):
    try:
        await events.aclose()
    except (RuntimeError, ProviderError):  # closing a generator an abandoned poll left running
        pass
