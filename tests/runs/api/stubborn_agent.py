"""An external agent that ignores cancels but keeps heartbeating: what the watchdog's
escalation is for. A separate process speaking only HTTP.

    python stubborn_agent.py BASE_URL KEY

Creates and claims a run, prints its id, then beats every 50 ms, never looking at
`cancel_requested`. Once a beat says it no longer holds the run (it was retired), it
tries to settle completed anyway — a late settle — and prints that answer's status
code and body, then exits 0.
"""

import json
import sys
import time

import httpx


def main(base, key):
    with httpx.Client(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=10) as api:
        run_id = api.post("/runs", json={"agent": "stubborn", "claim": True}).raise_for_status().json()["id"]
        print(run_id, flush=True)
        while api.post(f"/runs/{run_id}/heartbeat").json()["held"]:
            time.sleep(0.05)  # the agent's own pace: it is the thing under test
        late = api.post(f"/runs/{run_id}/settle", json={"status": "completed", "reason": "completed"})
        print(late.status_code, json.dumps(late.json()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
