"""Coalescing a batch of deltas and tool events into few `run.progress` messages.

Live viewers need the text as it streams, not one socket frame per token: a batch
becomes one message per step and contiguous stretch of text. A delta that does not
continue the previous one (a gap or an overlap, e.g. a client retrying a batch)
starts a new message, so a viewer can still place every piece by its offset.

Messages are `runs.messages.progress`, `tools` holding the latest `runs.messages.tool`
per tool id within the message (with args, result, error). A message with tools only
has offset 0 and empty text.
"""

import logging

from channels.layers import get_channel_layer

from runs import groups, messages

log = logging.getLogger("runs.api")


def coalesce(run_id, events):
    """The messages for one batch of `events` (DeltaEvent/ToolEvent), in order."""
    messages, open_by_step = [], {}
    run_id = str(run_id)
    for event in events:
        message = open_by_step.get(event.step)
        if event.type == "delta":
            if not event.text:
                continue
            if message is not None and not message["text"]:
                message["offset"], message["text"] = event.offset, event.text
                continue
            if message is not None and message["offset"] + len(message["text"]) == event.offset:
                message["text"] += event.text
                continue
            message = _new(run_id, event.step, event.offset, event.text)
        else:
            if message is None:
                message = _new(run_id, event.step, 0, "")
            else:
                message["tools"] = [tool for tool in message["tools"] if tool["id"] != event.id]
                message["tools"].append(_tool(event))
                continue
            message["tools"].append(_tool(event))
        open_by_step[event.step] = message
        messages.append(message)
    return messages


async def relay(run_id, messages):
    """Send `messages` to the run's viewers; best effort (logged, never raised).
    Returns how many were sent."""
    layer = get_channel_layer()
    if layer is None:
        return 0
    group, sent = groups.viewers(run_id), 0
    try:
        for message in messages:
            await layer.group_send(group, message)
            sent += 1
    except Exception:  # viewers missing deltas must not fail the agent
        log.warning("relaying progress of run %s failed", run_id, exc_info=True)
    return sent


def _new(run_id, step, offset, text):
    return messages.progress(run_id, step, offset=offset, text=text, tools=[])


def _tool(event):
    return messages.tool(event.id, event.name, event.state, args=event.args, result=event.result, error=event.error)
