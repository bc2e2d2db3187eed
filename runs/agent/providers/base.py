"""What a model provider is to the engine.

A provider turns a `ModelRequest` into a `Reply`, either streamed (`stream()` yields
text chunks, then exactly one `Reply`) or whole (`complete()`). It raises
`ProviderError` for anything that went wrong on its side; `retryable` says whether
asking again may help. Providers must be safe to abandon at any await: the engine
drops a request or a stream mid-flight when a cancel lands.
"""

import json
from dataclasses import dataclass, field
from decimal import Decimal


class ProviderError(Exception):
    """The provider failed. `retryable`: a later attempt may succeed (timeouts, 5xx,
    429); `retry_after`: seconds the provider asked us to wait, if it said;
    `answered`: the server answered on purpose (an HTTP error status) rather than a
    stream breaking, so there is nothing to rescue with a plain request."""

    def __init__(self, message, *, retryable=True, retry_after=None, error_class=None, answered=False):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.error_class = error_class or type(self).__name__
        self.answered = answered


class StreamStalled(ProviderError):
    """No stream event before the first-event or idle deadline."""


class CircuitOpen(ProviderError):
    """The breaker is open: too many consecutive failures; not even tried."""

    def __init__(self, message):
        super().__init__(message, retryable=False)


class SimulatedDeath(Exception):
    """A scripted turn `{"die": true}`: the worker behaves as if it died (demo/triage)."""


@dataclass
class ToolCall:
    id: str
    name: str
    args: dict


@dataclass
class Reply:
    """One model message. `final`: the model considers the task done when it calls no
    tools (OpenAI semantics); the scripted provider ends by running out of script."""

    text: str = ""
    tool_calls: list = field(default_factory=list)
    parallel: bool = False
    needs_approval: bool = False
    needs_input: bool = False  # the reply asks the operator something: wait for input
    final: bool = True
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)


@dataclass
class ModelRequest:
    run_id: str
    index: int  # the step this call will become
    messages: list  # OpenAI-style chat history
    tools: list  # OpenAI-style tool specs


class Provider:
    """Base class; see the module docstring for the contract."""

    name = "provider"
    streaming = True

    def exhausted(self, index):
        """True when there is nothing more to do at step `index` (scripted: no turns left)."""
        return False

    def gate(self):
        """Seconds to wait before the next request (a rate limit); 0 to go now."""
        return 0.0

    def estimate(self, request, streamed):
        """(tokens_in, tokens_out, cost) of a request abandoned mid-stream: the provider
        bills the prompt and what it generated, but usage only comes with the reply.
        About four characters a token, the usual rule of thumb; providers that know
        better override it."""
        tokens_in = len(json.dumps(request.messages)) // 4 + 1
        tokens_out = (len(streamed) + 3) // 4
        return tokens_in, tokens_out, Decimal(0)

    async def stream(self, request):  # pragma: no cover - interface
        raise NotImplementedError
        yield

    async def complete(self, request):  # pragma: no cover - interface
        raise NotImplementedError

    async def aclose(self):
        """Release connections; called once when the run ends."""
