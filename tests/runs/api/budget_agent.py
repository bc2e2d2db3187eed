"""External agents that stream past their token budget: separate processes for the
guardrail tests, speaking to a live server.

    python budget_agent.py obey BASE_URL KEY
    python budget_agent.py ignore BASE_URL KEY

`obey`: the official client (`runwarden_client`). Creates and claims a run with a token
budget of 30, prints its id, then streams and commits steps of 10 tokens each, never
looking at its spend. The server stops it; it prints one JSON line: what it caught
(`Stopped` and its reason) and the settle's answer, and exits 0.

`ignore`: a bare HTTP agent that hears the stop and ignores it (like stubborn_agent.py).
Creates a run with a token budget of 20, opens the control socket, prints the run id,
commits one step of 25 tokens, then heartbeats every 50 ms and never settles, printing
each control frame it receives as a JSON line. Once a beat says it no longer holds the
run it tries to settle completed anyway — a late settle — prints that answer's status
code and body, then exits 0.
"""

import json
import sys
import time

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect


def obey(base, key):
    from runwarden_client import Client, Stopped

    caught = {}
    with Client(base, key, flush_s=0.02, heartbeat_s=0.2) as client:
        with client.run("budget-obey", token_budget=30) as run:
            print(run.id, flush=True)
            try:
                while True:
                    run.stream("tick ")
                    run.usage(tokens_in=4, tokens_out=6)
                    run.step()
            except Stopped as stopped:
                caught = {"caught": type(stopped).__name__, "reason": stopped.reason, "note": stopped.note}
                raise
    print(json.dumps({**caught, "settled": run.settled}), flush=True)


def ignore(base, key):
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=f"{base}/api/v1", headers=auth, timeout=10) as api:
        run_id = api.post("/runs", json={"agent": "budget-ignore", "claim": True, "token_budget": 20}
                          ).raise_for_status().json()["id"]
        with connect(base.replace("http", "ws", 1) + f"/ws/agent/runs/{run_id}/", additional_headers=auth) as control:
            assert json.loads(control.recv(timeout=10))["type"] == "ready"
            print(run_id, flush=True)
            api.post(f"/runs/{run_id}/steps", json={"index": 0, "kind": "message", "text": "a", "tokens_out": 25}
                     ).raise_for_status()
            while api.post(f"/runs/{run_id}/heartbeat").json()["held"]:
                try:
                    print(control.recv(timeout=0.05), flush=True)  # heard, and ignored
                except TimeoutError:
                    pass  # the agent's own pace: it is the thing under test
                except ConnectionClosed:
                    time.sleep(0.05)
        late = api.post(f"/runs/{run_id}/settle", json={"status": "completed", "reason": "completed"})
        print(late.status_code, json.dumps(late.json()), flush=True)


if __name__ == "__main__":
    {"obey": obey, "ignore": ignore}[sys.argv[1]](*sys.argv[2:4])
