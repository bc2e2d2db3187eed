"""Runwarden's official Python client: report an agent's run live and obey the Abort button
(`Cancelled`) and a guardrail's stop (`Stopped`, a kind of Cancelled: a budget ran out).

    from runwarden_client import Client            # blocking, threads
    from runwarden_client.aio import AsyncClient   # asyncio

See clients/python/README.md.
"""

from runwarden_client._common import Cancelled, Failed, RunwardenError, Stopped
from runwarden_client.sync import Client, Run

__all__ = ["Cancelled", "Client", "Failed", "Run", "RunwardenError", "Stopped"]
