"""Tools: async callables the model may call, and the built-ins.

A tool is `async def tool(ctx, **args) -> result` (anything JSON-serialisable). The
engine abandons a tool at its next await when a cancel lands, and cleanup after that
await may not run to completion, so every tool must be **safe to abandon at any
await**: land writes atomically (temp file, then rename), keep side effects idempotent,
hold no invariant across an await. Raising is fine: the error becomes the call's
result (`{"error": ...}`) and the model sees it.

Built-ins: `sleep` (cancel-aware), `echo`, `write_file` (atomic, inside the workspace).
"""

import asyncio
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from runs.agent import racing

CHUNK = 64 * 1024


@dataclass
class ToolContext:
    run_id: str
    signal: object  # the run's CancelSignal, for cancel-aware waits inside a tool
    workspace: Path


@dataclass
class Tool:
    name: str
    fn: object
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    needs_approval: bool = False  # the run waits for an operator's yes before calling it

    def spec(self):
        """The OpenAI-style tool description sent to the model."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class ToolError(Exception):
    """A tool refused its arguments; the message goes back to the model."""


async def sleep_tool(ctx, seconds=1.0, **_):
    seconds = float(seconds)
    if not 0 <= seconds <= 3600:
        raise ToolError("seconds must be between 0 and 3600")
    await racing.sleep(ctx.signal, seconds)
    return {"slept": seconds}


async def echo_tool(ctx, **args):
    return args


# Each write yields here; tests patch it to stop a write halfway through.
async def _pause():
    await asyncio.sleep(0)


async def write_file_tool(ctx, path, content="", **_):
    """Write `content` to `path` inside the workspace, atomically: a temp file next to
    the target, then `os.replace`. Abandoned at any await, it leaves no partial file:
    the temp file is removed, and the rename is never reached."""
    target = _inside(ctx.workspace, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    data = str(content).encode()
    renamed = False
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            for start in range(0, len(data), CHUNK):
                handle.write(data[start : start + CHUNK])
                await _pause()
            handle.flush()
            os.fsync(handle.fileno())
        # No await between the last check and the rename: it happens whole or not at all.
        os.replace(temp, target)
        renamed = True
    finally:
        if not renamed:
            temp.unlink(missing_ok=True)
    return {"path": str(target.relative_to(ctx.workspace)), "bytes": len(data)}


def _inside(workspace, path):
    root = Path(workspace).resolve()
    target = (root / str(path)).resolve()
    if not str(path) or target == root or root not in target.parents:
        raise ToolError(f"path {path!r} is outside the workspace")
    return target


def builtins():
    """A fresh registry of the built-in tools, by name."""
    number = {"type": "number"}
    tools = [
        Tool("sleep", sleep_tool, "Wait some seconds.", {"type": "object", "properties": {"seconds": number}}),
        Tool("echo", echo_tool, "Return the arguments unchanged.", {"type": "object", "properties": {}}),
        Tool(
            "write_file",
            write_file_tool,
            "Write a text file in the workspace (atomically).",
            {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path"],
            },
        ),
    ]
    return {tool.name: tool for tool in tools}
