from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self):
        from django.db.backends.signals import connection_created

        from dashboard import accounts  # noqa: F401 - its receivers close sockets on logout
        from dashboard.outage import outage

        # The first connection that opens after an outage ends it (one log line).
        connection_created.connect(outage.recovered, dispatch_uid="runwarden-outage-recovered")
