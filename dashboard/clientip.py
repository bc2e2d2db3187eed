"""Who is asking: kept here for its callers (login throttling names
`dashboard.clientip.client_ip` in settings); the logic lives in `runs.clientip`, since
the admin and the API (in `runs`) record the address too, and `runs` never imports
`dashboard`."""

from runs.clientip import client_ip, forwarded

__all__ = ["client_ip", "forwarded"]
