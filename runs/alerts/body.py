"""What a delivery says: the payload kept in the outbox row, and the body sent.

The payload is taken when the alert is written (the run as it was then, the event's
data), so a retry a day later, or a run since deleted, sends the same thing.
"""

import json

from django.conf import settings
from django.urls import NoReverseMatch, reverse

from runs.alert_records import AlertFormat, AlertOn


def payload(run, data):
    """The outbox row's payload for an alert about `run` (None: about many runs)."""
    snapshot = None
    if run is not None:
        snapshot = {"id": str(run.id), "title": run.title, "status": run.status, "reason": run.termination_reason}
    return {"agent": run.agent if run is not None else "", "run": snapshot, "data": data or {}}


def run_url(run_id):
    """The run page: absolute under RUNWARDEN_PUBLIC_URL when it is set, else a path."""
    try:
        path = reverse("dashboard:run", args=[run_id])
    except NoReverseMatch:  # a process without the dashboard's URLs
        path = f"/runs/{run_id}/"
    base = settings.RUNWARDEN_PUBLIC_URL.rstrip("/")
    return f"{base}{path}" if base else path


def document(delivery):
    """The JSON body as a dict (docs/alerts.md, "The body")."""
    kept = delivery.payload or {}
    run = dict(kept["run"]) if kept.get("run") else None
    if run is not None:
        run["url"] = run_url(run["id"])
    return {
        "id": str(delivery.idempotency_key),
        "event": delivery.event,
        "rule": delivery.rule.name,
        "agent": kept.get("agent") or delivery.rule.agent,
        "run": run,
        "at": delivery.created_at.isoformat(),
        "data": kept.get("data") or {},
    }


def summary(doc):
    """One line a person reads in a chat channel."""
    data, run = doc["data"], doc["run"]
    who = doc["agent"] or "all agents"
    if doc["event"] == AlertOn.FAILURE_RATE:
        return (f"Runwarden: {data.get('failed')} of {data.get('ended')} runs of {who} failed in the last "
                f"{data.get('window_s')}s ({data.get('rate_pct')}%, rule {doc['rule']})")
    label = AlertOn(doc["event"]).label if doc["event"] in AlertOn.values else doc["event"]
    detail = data.get("flag") or data.get("limit") or ""
    line = f"Runwarden: {label}{f' ({detail})' if detail else ''}"
    if run is not None:
        line += f" — {run['title'] or 'run'} of {who}, {run['status']}: {run['url']}"
    return f"{line} (rule {doc['rule']})"


def encode(delivery):
    """The bytes POSTed: the JSON body, or for format=slack a Slack incoming-webhook body."""
    doc = document(delivery)
    if delivery.rule.format == AlertFormat.SLACK:
        doc = {"text": summary(doc)}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
