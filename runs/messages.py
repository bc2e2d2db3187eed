"""Every message on the channel layer, defined once: its shape and its constructor.

    type          sent to                          by                                handled by
    run.changed   viewers(run), LIST_GROUP         runs.broadcast, after commit       the dashboard consumers
                                                                                      (`run_changed`); a worker's
                                                                                      list subscription (queued: wake)
    run.cancel    control(run)                     runs.broadcast, when the           the engine's runner, the agent
                                                   transition says the worker must    API's socket and long-poll
                                                   hear it (`hard`: drop the task)
    run.resync    control(run)                     a run page's consumer, on          the engine's runner: answers
                                                   connect and on a gap               `reply_channel` with a snapshot
    run.progress  viewers(run), or a reply         the engine (progress.py), the      the run page's consumer
                  channel                          agent API (relay.py)

Tool states have one vocabulary, the agent API's published one: TOOL_STATES. The engine
speaks it too, so a page shows the same word whoever runs the agent.

Messages stay plain dicts of plain values (msgpack on Redis); the TypedDicts name
their keys for readers and type checkers.
"""

from typing import TypedDict

CHANGED, CANCEL, RESYNC, PROGRESS = "run.changed", "run.cancel", "run.resync", "run.progress"
ANSWERED = "run.answered"  # an operator answered a held wait: its holder fetches the answer

STARTED, FINISHED, FAILED = "started", "finished", "failed"
TOOL_STATES = (STARTED, FINISHED, FAILED)


class Changed(TypedDict):
    type: str
    run_id: str
    status: str
    seq: int
    event: str  # the RunEvent kind


class Cancel(TypedDict, total=False):
    type: str
    run_id: str
    source: str
    note: str
    hard: bool  # the watchdog's escalation: drop the run's task at its next await
    stop: str  # a guardrail's stop, not an abort: the ending it asks for (budget_exhausted, policy_denied)


class Resync(TypedDict):
    type: str
    reply_channel: str


class Tool(TypedDict, total=False):
    id: str
    name: str
    state: str  # one of TOOL_STATES
    args: object
    result: object
    error: object


class Progress(TypedDict, total=False):
    type: str
    run_id: str
    step: int  # the in-flight step's index
    offset: int  # where `text` starts in that step's streamed text
    text: str
    tools: list  # of Tool
    resync: bool  # the whole in-flight text from offset 0: replaces what a viewer shows


def changed(run, event) -> Changed:
    return {"type": CHANGED, "run_id": str(run.id), "status": str(run.status), "seq": event.seq,
            "event": str(event.kind)}


def cancel(run, *, hard=False) -> Cancel:
    message = {"type": CANCEL, "run_id": str(run.id), "source": str(run.cancel_source), "note": run.cancel_note}
    if run.stop_reason:
        message["stop"] = str(run.stop_reason)
    if hard:
        message["hard"] = True
    return message


def hard_stop(run) -> Cancel:
    return cancel(run, hard=True)


class Answered(TypedDict):
    type: str
    run_id: str


def answered(run) -> Answered:
    return {"type": ANSWERED, "run_id": str(run.id)}


def resync(reply_channel) -> Resync:
    return {"type": RESYNC, "reply_channel": reply_channel}


def progress(run_id, step, *, offset=0, text="", tools=None, resync=False) -> Progress:
    message = {"type": PROGRESS, "run_id": str(run_id), "step": step, "offset": offset, "text": text}
    if tools is not None:
        message["tools"] = tools
    if resync:
        message["resync"] = True
    return message


def tool(call_id, name, state, **details) -> Tool:
    if state not in TOOL_STATES:
        raise ValueError(f"unknown tool state {state!r}: one of {', '.join(TOOL_STATES)}")
    return {"id": call_id, "name": name, "state": state, **details}
