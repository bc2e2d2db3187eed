"""The demo feeder: keeps creating scripted runs of varied shapes, so the dashboard
(`make run`) always has something live to watch, abort, approve and triage.

Shapes: long word-by-word streams, parallel tool waves, sequential tools, a token
budget stop, an iteration cap, a provider failure, a stream that breaks and falls back,
an approval wait, a policy denial, a run that calls the same tool the same way three
times in a row (flagged by loop detection, `runs.loops`), and now and then a run whose
worker "dies" (stops heartbeating, never settles) for the reaper and the retire button.
"""

import asyncio
import logging
import random

from channels.db import database_sync_to_async

from runs import transitions
from runs.models import Run

log = logging.getLogger(__name__)

TOPICS = [
    "the quarterly report", "the incident timeline", "a customer escalation", "the release notes",
    "the on-call handbook", "a flaky test suite", "the pricing page", "last week's support tickets",
]
WORDS = (
    "the agent reads the context weighs the options drafts a plan checks the facts and writes a careful "
    "answer with sources notes caveats and next steps for the operator to review before anything ships"
).split()


def _say(rng, low=25, high=70, delay=(40, 110)):
    return {"say": " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))),
            "token_delay_ms": rng.randint(*delay)}


def _shape(rng, n):
    """(shape name, create_run kwargs) for the n-th demo run."""
    topic = rng.choice(TOPICS)
    shapes = {
        "long stream": lambda: dict(title=f"Summarise {topic}", script=[_say(rng, 60, 140), _say(rng), _say(rng)]),
        "tool wave": lambda: dict(title=f"Research {topic}", script=[
            _say(rng, 10, 25),
            {"tools": [{"name": "sleep", "args": {"seconds": rng.uniform(1, 3)}},
                       {"name": "sleep", "args": {"seconds": rng.uniform(1, 3)}},
                       {"name": "echo", "args": {"query": topic}},
                       {"name": "write_file", "args": {"path": f"demo/notes-{n}.md", "content": f"# {topic}\n"}}],
             "parallel": True},
            _say(rng)]),
        "sequential tools": lambda: dict(title=f"Check {topic}", script=[
            _say(rng, 10, 20), {"tools": [{"name": "sleep", "args": {"seconds": 1.5}}, {"name": "echo", "args": {"ok": True}}]},
            _say(rng)]),
        "budget stop": lambda: dict(title=f"Rewrite {topic} (small budget)", token_budget=90,
                                    script=[_say(rng, 30, 40) for _ in range(5)]),
        "iteration cap": lambda: dict(title=f"Iterate on {topic}", max_iterations=2,
                                      script=[_say(rng, 15, 30) for _ in range(5)]),
        "provider failure": lambda: dict(title=f"Translate {topic}", script=[_say(rng, 15, 30), {"fail": "provider"}]),
        "broken stream": lambda: dict(title=f"Outline {topic}", script=[dict(_say(rng), fail="stream"), _say(rng)]),
        "approval wait": lambda: dict(title=f"Publish {topic}", script=[
            _say(rng, 10, 25),
            {"ask_approval": {"tool": "write_file", "args": {"path": f"demo/publish-{n}.md", "content": topic}}},
            _say(rng, 10, 25)], approval_timeout_s=180),
        "policy denial": lambda: dict(title=f"Clean up after {topic}", script=[
            _say(rng, 10, 20), {"tools": [{"name": "shell", "args": {"cmd": "rm -rf /tmp/demo"}}]}]),
        "worker dies": lambda: dict(title=f"Index {topic}", script=[_say(rng, 20, 40), {"die": True}]),
        "loop": lambda: dict(title=f"Look up {topic} (going in circles)", script=[
            _say(rng, 10, 20), *({"tools": [{"name": "echo", "args": {"query": topic}}]} for _ in range(3)),
            _say(rng, 10, 20)]),
    }
    weights = {"long stream": 5, "tool wave": 4, "sequential tools": 2, "budget stop": 2, "iteration cap": 1,
               "provider failure": 1, "broken stream": 1, "approval wait": 2, "policy denial": 1, "worker dies": 1,
               "loop": 1}
    name = rng.choices(list(weights), weights=list(weights.values()))[0]
    spec = shapes[name]()
    script, timeout = spec.pop("script"), spec.pop("approval_timeout_s", None)
    data = {"script": script, "demo": name}
    if timeout:
        data["approval_timeout_s"] = timeout
    return name, dict(spec, input=data)


@database_sync_to_async
def _live_demo_runs():
    return Run.objects.filter(status__in=Run.NON_TERMINAL, input__has_key="demo").count()


async def feed(stop, *, every_s=3.0, max_live=12, rng=None):
    """Create a demo run every `every_s` seconds (while fewer than `max_live` are
    live) until `stop` is set."""
    rng = rng or random.Random()
    n = 0
    while not stop.is_set():
        try:
            if await _live_demo_runs() < max_live:
                n += 1
                name, kwargs = _shape(rng, n)
                await transitions.acreate_run(agent="scripted", **kwargs)
                log.debug("demo run %d: %s", n, name)
        except Exception:  # noqa: BLE001 - a demo hiccup must not end the feed
            log.exception("demo feed failed to create a run")
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass
