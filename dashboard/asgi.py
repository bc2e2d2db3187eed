"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
# A server's PostgreSQL connections come from a bounded pool (RUNWARDEN_DB_POOL_SIZE);
# `manage.py` processes (workers, watchdog, CLI) connect directly unless told otherwise.
os.environ.setdefault("RUNWARDEN_DB_POOL", "1")

from dashboard.env import ConfigError  # noqa: E402

try:
    from django.core.asgi import get_asgi_application

    django_asgi = get_asgi_application()
except ConfigError as error:
    sys.exit(f"runwarden: configuration error: {error}")

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from dashboard.routing import websocket_application  # noqa: E402

if not settings.DEBUG and not (settings.STATIC_ROOT / "staticfiles.json").exists():
    # Every page links to hashed files: without them the dashboard has no JavaScript.
    sys.exit(
        f"runwarden: configuration error: static files are not collected in {settings.STATIC_ROOT}"
        " (run `python manage.py collectstatic --noinput`, or set STATIC_ROOT)"
    )

from dashboard import limits  # noqa: E402

# Bodies over RUNWARDEN_MAX_BODY_BYTES: 413 before daphne (or Django) buffers them.
limits.guard_daphne(settings.RUNWARDEN_MAX_BODY_BYTES)
http_application = limits.BodyLimit(django_asgi, settings.RUNWARDEN_MAX_BODY_BYTES)
application = ProtocolTypeRouter({"http": http_application, "websocket": websocket_application})

if settings.RUNWARDEN_EMBEDDED:
    # `make run`: workers and the demo feeder on this server's event loop.
    from dashboard.engine_middleware import EmbeddedWorkers

    application = EmbeddedWorkers(application)
