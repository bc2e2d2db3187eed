"""The agent API: an authenticated JSON API (django-ninja, `/api/v1/`) and a control
channel (`/ws/agent/runs/<id>/`, and a long-poll) through which agents written in any
language take runs, report progress, commit steps, settle, and receive cancels.

Every change goes through `runs.transitions`; the API only authenticates, validates,
checks that the key may touch the run, and maps outcomes onto HTTP.
"""
