"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

from dashboard.env import ConfigError  # noqa: E402

try:
    from django.core.asgi import get_asgi_application

    django_asgi = get_asgi_application()
except ConfigError as error:
    sys.exit(f"runwarden: configuration error: {error}")

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from dashboard.routing import websocket_application  # noqa: E402

if settings.DEBUG:
    # Plain daphne does not serve /static/; in DEBUG (the embedded default) we do.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_asgi = ASGIStaticFilesHandler(django_asgi)

application = ProtocolTypeRouter({"http": django_asgi, "websocket": websocket_application})

if settings.RUNWARDEN_EMBEDDED:
    # `make run`: workers and the demo feeder on this server's event loop.
    from dashboard.embedded import EmbeddedWorkers

    application = EmbeddedWorkers(application)
