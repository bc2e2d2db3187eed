"""A Runwarden agent in plain Python with only httpx: create-and-claim, stream, commit, obey cancel.

RUNWARDEN_URL=http://127.0.0.1:8000 RUNWARDEN_KEY=rw_... python docs/agent_client.py
"""
import os
import threading

import httpx

BASE = os.environ.get("RUNWARDEN_URL", "http://127.0.0.1:8000") + "/api/v1"
AUTH = {"Authorization": f"Bearer {os.environ['RUNWARDEN_KEY']}"}
STEPS, STEP_S = int(os.environ.get("RUNWARDEN_STEPS", "5")), float(os.environ.get("RUNWARDEN_STEP_S", "0.5"))


def watch(run_id, cancel):
    """The control channel (long-poll): returns the moment a cancel is pending."""
    with httpx.Client(base_url=BASE, headers=AUTH, timeout=90) as control:
        while not cancel.is_set():
            answer = control.get(f"/runs/{run_id}/control", params={"wait": 30})
            if answer.status_code == 200:  # a cancel is pending, or the run is no longer ours
                cancel.set()


with httpx.Client(base_url=BASE, headers=AUTH, timeout=30) as api:
    run = api.post("/runs", json={"agent": "demo", "title": "httpx client", "claim": True}).raise_for_status().json()
    print(run["id"], flush=True)
    cancel = threading.Event()
    threading.Thread(target=watch, args=(run["id"], cancel), daemon=True).start()
    for index in range(STEPS):
        text = f"step {index} done. "
        api.post(f"/runs/{run['id']}/events", json={"events": [{"type": "delta", "step": index, "offset": 0, "text": text}]})
        if cancel.wait(STEP_S):  # the work, cut short by a cancel: the step in flight is discarded
            break
        step = api.post(f"/runs/{run['id']}/steps", json={"index": index, "kind": "message", "text": text},
                        headers={"Idempotency-Key": f"{run['id']}-{index}"})
        if step.status_code == 409:  # a cancel (or retire) landed first: the step was not kept
            cancel.set()
            break
    outcome = ("cancelled", "cancelled") if cancel.is_set() else ("completed", "completed")
    settle = api.post(f"/runs/{run['id']}/settle", json={"status": outcome[0], "reason": outcome[1]},
                      headers={"Idempotency-Key": f"{run['id']}-settle"})
    print(settle.status_code, settle.json(), flush=True)
