"""Built-in tools, and what an abandoned one leaves behind (nothing)."""

import asyncio

import pytest

from runs.agent import tools
from runs.agent.cancel import Cancelled, CancelSignal
from runs.agent.racing import race
from runs.agent.tools import ToolContext, ToolError, write_file_tool

pytestmark = pytest.mark.asyncio


@pytest.fixture
def tool_ctx(tmp_path):
    return ToolContext(run_id="r", signal=CancelSignal(), workspace=tmp_path / "ws")


async def test_write_file_lands_whole_inside_the_workspace(tool_ctx):
    result = await write_file_tool(tool_ctx, path="notes/a.txt", content="hello")
    assert result == {"path": "notes/a.txt", "bytes": 5}
    assert (tool_ctx.workspace / "notes/a.txt").read_text() == "hello"
    assert sorted(p.name for p in (tool_ctx.workspace / "notes").iterdir()) == ["a.txt"]


async def test_write_file_refuses_paths_outside_the_workspace(tool_ctx):
    for path in ("../escape.txt", "/etc/passwd", ""):
        with pytest.raises(ToolError):
            await write_file_tool(tool_ctx, path=path, content="x")


async def test_abandoned_write_file_leaves_no_file(tool_ctx, monkeypatch):
    chunks = []

    async def cancel_on_the_second_chunk():
        chunks.append(1)
        if len(chunks) == 2:
            # Half the data is on disk in the temp file; the cancel lands now.
            assert any(tool_ctx.workspace.iterdir())
            asyncio.get_running_loop().call_soon(tool_ctx.signal.cancel)
            await asyncio.Event().wait()

    monkeypatch.setattr(tools, "_pause", cancel_on_the_second_chunk)
    content = "x" * (tools.CHUNK * 4)
    with pytest.raises(Cancelled):
        await race(write_file_tool(tool_ctx, path="big.txt", content=content), tool_ctx.signal)
    assert len(chunks) == 2
    assert list(tool_ctx.workspace.iterdir()) == []  # no target, no temp file


async def test_abandoned_write_file_keeps_the_previous_version_whole(tool_ctx, monkeypatch):
    await write_file_tool(tool_ctx, path="f.txt", content="old")

    async def cancel_now():
        asyncio.get_running_loop().call_soon(tool_ctx.signal.cancel)
        await asyncio.Event().wait()

    monkeypatch.setattr(tools, "_pause", cancel_now)
    with pytest.raises(Cancelled):
        await race(write_file_tool(tool_ctx, path="f.txt", content="new" * 100), tool_ctx.signal)
    assert [p.name for p in tool_ctx.workspace.iterdir()] == ["f.txt"]
    assert (tool_ctx.workspace / "f.txt").read_text() == "old"


async def test_sleep_tool_is_cancel_aware(tool_ctx):
    task = asyncio.ensure_future(tools.sleep_tool(tool_ctx, seconds=30))
    await asyncio.sleep(0)
    tool_ctx.signal.cancel()
    with pytest.raises(Cancelled):
        await asyncio.wait_for(task, 2)


async def test_echo_returns_its_arguments(tool_ctx):
    assert await tools.echo_tool(tool_ctx, a=1, b="x") == {"a": 1, "b": "x"}
