"""Model providers, chosen by a run's agent name."""

from django.conf import settings

from runs.agent.providers.base import (  # noqa: F401 - the package's public names
    CircuitOpen,
    ModelRequest,
    Provider,
    ProviderError,
    Reply,
    SimulatedDeath,
    StreamStalled,
    ToolCall,
)

AGENTS = ("scripted", "openai")


def for_run(run):
    """The provider for `run` (by agent name). Raises ValueError for an unknown agent
    or a malformed input: the run cannot start."""
    if run.agent == "scripted":
        from runs.agent.providers.scripted import ScriptedProvider

        return ScriptedProvider((run.input or {}).get("script", []))
    if run.agent == "openai":
        from runs.agent.providers.openai import OpenAIProvider

        return OpenAIProvider(
            base_url=settings.RUNWARDEN_OPENAI_BASE_URL,
            api_key=settings.RUNWARDEN_OPENAI_API_KEY,
            model=(run.input or {}).get("model") or settings.RUNWARDEN_OPENAI_MODEL,
        )
    raise ValueError(f"no provider for agent {run.agent!r}")
