"""One load-generating client of `manage.py bench_ingest`, run in its own process.

Imports only httpx, so a spawned process starts fast and never touches Django.
"""

import time

import httpx


def post_batches(base_url, key, run_id, batch, text, start_at, stop_at):
    """POST event batches to one run from `start_at` to `stop_at` (wall clock).
    Returns (events accepted, [request seconds], errors)."""
    events = [{"type": "delta", "step": 0, "offset": i * len(text), "text": text} for i in range(batch)]
    body = {"events": events}
    accepted, latencies, errors = 0, [], 0
    with httpx.Client(base_url=f"{base_url}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30) as api:
        api.post(f"/runs/{run_id}/events", json=body)  # warm the connection
        time.sleep(max(0.0, start_at - time.time()))  # all clients start together
        while time.time() < stop_at:
            began = time.perf_counter()
            response = api.post(f"/runs/{run_id}/events", json=body)
            latencies.append(time.perf_counter() - began)
            if response.status_code == 200:
                accepted += response.json()["accepted"]
            else:
                errors += 1
    return accepted, latencies, errors
