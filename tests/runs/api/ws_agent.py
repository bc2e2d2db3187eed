"""An external agent for the end-to-end test: a separate process that speaks only HTTP
(JSON requests, and a WebSocket upgrade for the control channel) to a live server.

    python ws_agent.py BASE_URL KEY

Creates and claims a run, opens the control socket, prints the run id. A worker
thread loops: "work" for 50 ms, stream a delta, commit a step. The main thread waits
on the socket; on `{"type": "cancel"}` it stops the loop and settles
cancelled/cancelled at once — the step in flight is discarded (the server refuses to
commit a step once a cancel is pending). Prints the settle answer and exits 0.
"""

import json
import sys
import threading

import httpx
from websockets.sync.client import connect


def work(base, auth, run_id, stop):
    with httpx.Client(base_url=f"{base}/api/v1", headers=auth, timeout=10) as api:
        index = 0
        while not stop.wait(0.05):  # the work, cut short by a cancel
            api.post(f"/runs/{run_id}/events", json={"events": [{"type": "delta", "step": index, "offset": 0, "text": "tick"}]})
            if api.post(f"/runs/{run_id}/steps", json={"index": index, "kind": "message", "text": "tick"}).status_code == 201:
                index += 1


def main(base, key):
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=f"{base}/api/v1", headers=auth, timeout=10) as api:
        run_id = api.post("/runs", json={"agent": "e2e-ws", "claim": True}).raise_for_status().json()["id"]
        ws_url = base.replace("http", "ws", 1) + f"/ws/agent/runs/{run_id}/"
        with connect(ws_url, additional_headers=auth) as control:
            assert json.loads(control.recv(timeout=10))["type"] == "ready"
            stop = threading.Event()
            worker = threading.Thread(target=work, args=(base, auth, run_id, stop), daemon=True)
            worker.start()
            print(run_id, flush=True)
            while json.loads(control.recv())["type"] != "cancel":
                pass
            stop.set()
            settled = api.post(f"/runs/{run_id}/settle", json={"status": "cancelled", "reason": "cancelled"})
            print(settled.status_code, json.dumps(settled.json()), flush=True)
            worker.join(timeout=10)
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
