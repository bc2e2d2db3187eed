"""The servers' settings in test_pgbouncer, until dashboard.settings has its own
RUNWARDEN_PGBOUNCER (the production-settings work adds it): meanwhile this does what that
setting is to do, turn server-side cursors off. Once the real setting exists this module
steps aside, and the test checks the real one. Delete it then.
"""

import os

from dashboard import settings as _base
from dashboard.settings import *  # noqa: F403

if not hasattr(_base, "RUNWARDEN_PGBOUNCER") and os.environ.get("RUNWARDEN_PGBOUNCER") == "1":
    # A `.iterator()` cursor lives past its transaction; pgbouncer's next transaction may
    # be on another server connection, where the cursor does not exist.
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True  # noqa: F405
