"""`GET /healthz`: this process is up and answering, for a load balancer or a monitor.

It touches neither the database nor Redis, so one slow dependency does not mark every
server down at once (the pages say what is wrong; /metrics counts it). Async, so it
never queues behind Django's one thread for sync views.
"""

from django.http import HttpResponse
from django.views.decorators.http import require_safe


@require_safe
async def healthz(request):
    return HttpResponse("ok\n", content_type="text/plain", headers={"Cache-Control": "no-store"})
