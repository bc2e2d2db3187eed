"""Refuse NUL bytes in query strings and form fields with a 400.

PostgreSQL text cannot hold a NUL, so one in a search box, a filter or an abort note
would otherwise surface as a database error (a 500) deep inside a view. Checked once
here for every page; the agent API parses and refuses its own JSON bodies.

Sync and async capable: a sync-only middleware would run async views (the agent API's
30-second long-poll) through Django's one thread-sensitive thread, stalling every
other sync view behind them.
"""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponseBadRequest


def refusal(request):
    """The 400 for a request carrying a NUL byte in a parameter, or None."""
    for params in (request.GET, request.POST):
        for key, values in params.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return HttpResponseBadRequest(
                    "NUL bytes are not allowed in request parameters.\n", content_type="text/plain"
                )
    return None


class RejectNulBytes:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return refusal(request) or self.get_response(request)

    async def _acall(self, request):
        # Under ASGI the body is already read: parsing the form here does no I/O.
        return refusal(request) or await self.get_response(request)
