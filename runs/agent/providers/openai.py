"""Any OpenAI-compatible `/v1/chat/completions` endpoint, streamed over httpx.

Retries, backoff and the circuit breaker live in the engine (`runs.agent.model`), so
they are cancel-aware in one place; this module only speaks the protocol and maps its
failures onto `ProviderError` (retryable: transport errors, 408, 409, 429, 5xx).
The model, base URL and key come from settings, or from `run.input["model"]`.
"""

import json
from decimal import Decimal

import httpx

from runs.agent.providers.base import Provider, ProviderError, Reply, ToolCall

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIProvider(Provider):
    name = "openai"

    def __init__(self, *, base_url, api_key, model, timeout_s=60.0, price_in=0, price_out=0, transport=None):
        self.model = model
        self.price_in, self.price_out = Decimal(str(price_in)), Decimal(str(price_out))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # The engine's stream deadlines bound each event; this bounds connect and idle socket.
        self.client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout_s, transport=transport
        )

    def _body(self, request, stream):
        body = {"model": self.model, "messages": request.messages, "stream": stream}
        if request.tools:
            body["tools"] = request.tools
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def stream(self, request):
        text, calls, usage = [], {}, {}
        try:
            async with self.client.stream("POST", "chat/completions", json=self._body(request, True)) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise _status_error(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = _json(data)
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if delta.get("content"):
                            text.append(delta["content"])
                            yield delta["content"]
                        for part in delta.get("tool_calls") or []:
                            _merge_call(calls, part)
        except httpx.HTTPError as error:
            raise ProviderError(f"{type(error).__name__}: {error}", error_class=type(error).__name__) from None
        message = {"content": "".join(text), "tool_calls": [calls[i] for i in sorted(calls)]}
        yield self._reply(message, usage)

    async def complete(self, request):
        try:
            response = await self.client.post("chat/completions", json=self._body(request, False))
        except httpx.HTTPError as error:
            raise ProviderError(f"{type(error).__name__}: {error}", error_class=type(error).__name__) from None
        if response.status_code != 200:
            raise _status_error(response)
        body = _json(response.text)
        choices = body.get("choices") or [{}]
        return self._reply(choices[0].get("message") or {}, body.get("usage") or {})

    def estimate(self, request, streamed):
        tokens_in, tokens_out, _ = super().estimate(request, streamed)
        return tokens_in, tokens_out, self.price_in * tokens_in + self.price_out * tokens_out

    def _reply(self, message, usage):
        calls = []
        for raw in message.get("tool_calls") or []:
            function = raw.get("function") or {}
            try:
                args = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {"_unparsed": function.get("arguments")}
            calls.append(ToolCall(id=raw.get("id") or "", name=function.get("name") or "", args=args))
        tokens_in = int(usage.get("prompt_tokens") or 0)
        tokens_out = int(usage.get("completion_tokens") or 0)
        return Reply(
            text=message.get("content") or "",
            tool_calls=calls,
            parallel=True,  # OpenAI's parallel tool calls are independent by contract
            final=not calls,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=self.price_in * tokens_in + self.price_out * tokens_out,
        )

    async def aclose(self):
        await self.client.aclose()


def _merge_call(calls, part):
    """Tool calls arrive in fragments keyed by `index`; arguments are concatenated."""
    entry = calls.setdefault(part.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    if part.get("id"):
        entry["id"] = part["id"]
    function = part.get("function") or {}
    entry["function"]["name"] += function.get("name") or ""
    entry["function"]["arguments"] += function.get("arguments") or ""


def _json(data):
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        raise ProviderError("provider sent malformed JSON", error_class="MalformedResponse") from None


def _status_error(response):
    retry_after = response.headers.get("retry-after")
    try:
        retry_after = float(retry_after) if retry_after else None
    except ValueError:
        retry_after = None
    return ProviderError(
        f"HTTP {response.status_code} from provider",
        retryable=response.status_code in RETRYABLE_STATUS,
        retry_after=retry_after,
        error_class=f"HTTP{response.status_code}",
        answered=True,
    )
