"""Channel-layer group names shared by the worker, the dashboard and the agent API."""

LIST_GROUP = "runs"


def viewers(run_id):
    """Viewers of one run: state changes and streamed deltas."""
    return f"run-{run_id}"


def control(run_id):
    """Whoever executes the run (built-in worker or external agent): cancels."""
    return f"run-{run_id}-control"
