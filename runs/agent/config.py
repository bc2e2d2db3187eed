"""Engine knobs, read once from settings (`# --- engine` in dashboard/settings.py).
Tests build one with `EngineConfig(**overrides)` instead of patching settings."""

from dataclasses import dataclass, field, fields
from pathlib import Path

from django.conf import settings


@dataclass(frozen=True)
class EngineConfig:
    heartbeat_s: float = 1.0
    retries: int = 2  # provider attempts after the first
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 120.0  # the longest provider Retry-After honoured
    stream_first_event_s: float = 30.0  # deadline for a stream's first event
    stream_idle_s: float = 30.0  # deadline between two stream events
    request_timeout_s: float = 60.0  # a non-streaming call
    tool_timeout_s: float = 60.0
    tool_wave: int = 4  # parallel tool calls per wave
    approval_timeout_s: float = 300.0  # how long a released wait lasts (run input approval_timeout_s wins)
    progress_hz: float = 10.0  # delta messages per second per run, at most
    breaker_threshold: int = 5
    breaker_reset_s: float = 30.0
    shutdown_grace_s: float = 10.0
    claim_poll_s: float = 0.5
    worker_db_connections: int = 8  # a worker's database connections, all told (half: the urgent lane)
    denied_tools: tuple = ("shell",)
    workspace: Path = field(default_factory=lambda: Path("var/workspace"))

    @classmethod
    def from_settings(cls, **overrides):
        names = {f.name: f"RUNWARDEN_{f.name.upper()}" for f in fields(cls)}
        values = {name: getattr(settings, setting) for name, setting in names.items() if hasattr(settings, setting)}
        if "denied_tools" in values:
            values["denied_tools"] = tuple(values["denied_tools"])
        values.update(overrides)
        return cls(**values)
