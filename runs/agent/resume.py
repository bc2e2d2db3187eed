"""What a released waiting run carries so that any worker can take it up again.

`pending_request["resume"]` = {"step": <the in-flight step, or None>, "taken": [...]}:
  step   the reply the run parked on (text, every tool call incl. the gated one, its
         usage, already charged to the run) and the calls of it approved so far;
  taken  the operator messages the engine took, each with the step it came before,
         since they live in no Step row.
The chat history is rebuilt from the committed Step rows with those messages in
place, so a resumed run asks the model exactly what the first worker would have.
"""

import json
from decimal import Decimal

from runs.agent.providers.base import Reply, ToolCall
from runs.models import Step


def state_of(run):
    """The resume state the run was parked with, if it is still the run's next step."""
    state = (run.pending_request or {}).get("resume") or {}
    step = state.get("step")
    if step is not None and step.get("index") != run.steps:
        step = None  # committed since, or stale: never replay a step twice
    return {"step": step, "taken": list(state.get("taken") or [])}


def dump_step(index, reply, granted):
    return {
        "index": index,
        "text": reply.text,
        "tool_calls": [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls],
        "parallel": reply.parallel,
        "needs_approval": reply.needs_approval,
        "final": reply.final,
        "tokens_in": reply.tokens_in,
        "tokens_out": reply.tokens_out,
        "cost": str(reply.cost),
        "approved": sorted(granted),
    }


def load_reply(step):
    return Reply(
        text=step.get("text", ""),
        tool_calls=[ToolCall(id=c["id"], name=c["name"], args=dict(c.get("args") or {})) for c in step["tool_calls"]],
        parallel=bool(step.get("parallel")),
        needs_approval=bool(step.get("needs_approval")),
        final=bool(step.get("final")),
        tokens_in=int(step.get("tokens_in", 0)),
        tokens_out=int(step.get("tokens_out", 0)),
        cost=Decimal(str(step.get("cost", "0"))),
    )


def history(run, taken):
    """The chat history after the run's committed steps (sync: a database read)."""
    before = {}
    for item in taken:
        before.setdefault(item["before"], []).append({"role": "user", "content": item["content"]})
    messages = opening(run)
    for step in Step.objects.filter(run_id=run.id).order_by("index"):
        messages += before.get(step.index, [])
        messages += turn(Reply(text=step.text), step.tool_calls)
    return messages + before.get(run.steps, [])


def opening(run):
    data = run.input or {}
    messages = []
    if data.get("system"):
        messages.append({"role": "system", "content": str(data["system"])})
    messages.append({"role": "user", "content": str(data.get("prompt") or run.title or "Begin.")})
    return messages


def turn(reply, records):
    """A committed step as chat messages: the model's, then one per tool result."""
    message = {"role": "assistant", "content": reply.text or None}
    if records:
        message["tool_calls"] = [
            {"id": r["id"], "type": "function", "function": {"name": r["name"], "arguments": json.dumps(r["args"])}}
            for r in records
        ]
    tool_messages = [
        {"role": "tool", "tool_call_id": r["id"], "content": json.dumps(r.get("result", {"error": r.get("error")}))}
        for r in records
    ]
    return [message, *tool_messages]
