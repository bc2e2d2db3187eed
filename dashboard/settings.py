"""Runwarden settings: the embedded default (SQLite, in-memory layer) unless the
environment names PostgreSQL (`DATABASE_URL`) and Redis (`REDIS_URL`)."""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
import django

from dashboard import env, envfile

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"
# `make run` writes var/runwarden.env (DEBUG=1, a generated SECRET_KEY) so `manage.py …`
# works in this checkout as the README writes it. The environment wins: the file only
# fills in what the environment does not set. RUNWARDEN_ENV_FILE names another file.
envfile.load(os.environ.get("RUNWARDEN_ENV_FILE") or VAR_DIR / "runwarden.env")

DEBUG = env.boolean("DEBUG")
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise env.ConfigError("SECRET_KEY is required unless DEBUG=1")
    SECRET_KEY = "runwarden-debug-only-insecure-key"
ALLOWED_HOSTS = env.hosts("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",  # login throttling: failures per user name + client address
    "csp",
    "servestatic",  # its system checks for the static-file settings
    "channels",
    "django_htmx",
    "ninja",  # serves the API docs page's assets locally: nothing loads from a CDN
    "runs",
    "dashboard",
]
if django.VERSION < (6, 0):  # partials are built into Django 6
    INSTALLED_APPS.append("template_partials")

MIDDLEWARE = [
    # Outermost: a database outage anywhere inside answers 503 (HTML, or JSON for the API
    # and /metrics), never 500; async-capable like everything below it.
    "dashboard.outage.DatabaseOutageMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    # Static files from this process, with DEBUG=0 too: hashed, compressed, cached forever.
    # ServeStatic (WhiteNoise's maintained fork) because its middleware is async: a sync
    # one would run every request, long-polls included, through Django's one
    # thread-sensitive thread.
    "servestatic.middleware.ServeStaticMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "dashboard.middleware.RejectNulBytes",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as its docs ask: turns a lockout into its page
]

ROOT_URLCONF = "dashboard.urls"
ASGI_APPLICATION = "dashboard.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------
DEFAULT_SQLITE = f"sqlite:///{VAR_DIR / 'runwarden.sqlite3'}"
DATABASE_URL = env.url("DATABASE_URL", DEFAULT_SQLITE, schemes={"sqlite", "postgres", "postgresql"})
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
# A server's connection budget (its psycopg pool's max size): the same variable and
# default the worker's own thread pool reads (see `# --- engine`).
RUNWARDEN_DB_POOL_SIZE = env.number("RUNWARDEN_DB_POOL_SIZE", 4, minimum=1, cast=int)
RUNWARDEN_DB_POOL_TIMEOUT_S = env.number("RUNWARDEN_DB_POOL_TIMEOUT_S", 5.0, minimum=0.1)
RUNWARDEN_PGBOUNCER = env.boolean("RUNWARDEN_PGBOUNCER")
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    database = DATABASES["default"]
    database.setdefault("OPTIONS", {})
    # A dead host answers within this, so an outage is a quick 503, not a hung request.
    database["OPTIONS"]["connect_timeout"] = env.number("RUNWARDEN_DB_CONNECT_TIMEOUT_S", 5, minimum=1, cast=int)
    # Broken connections are replaced, not reused: with the pool, Django passes
    # psycopg_pool.ConnectionPool.check_connection as the pool's `check` when this is on
    # (django/db/backends/postgresql/base.py; giving `check` in the pool options as well
    # would be a duplicate argument), so a connection that died in an outage is tested
    # and dropped at checkout instead of failing the first request after recovery.
    database["CONN_HEALTH_CHECKS"] = True
    if RUNWARDEN_PGBOUNCER:
        # PgBouncer in transaction mode is the pool: no second pool in the process, and no
        # server-side cursors (they outlive a transaction, which PgBouncer cannot follow).
        # Prepared statements are no problem: Django's psycopg backend binds parameters
        # on the client (ClientCursor unless OPTIONS["server_side_binding"] is True) and
        # sets prepare_threshold=None (base.py get_connection_params), so it prepares none.
        database["DISABLE_SERVER_SIDE_CURSORS"] = True
    elif env.boolean("RUNWARDEN_DB_POOL"):
        # On by default in servers only (dashboard/asgi.py sets RUNWARDEN_DB_POOL=1 unless
        # the environment says otherwise): a worker budgets its connections with its own
        # thread pool, and a pool smaller than its threads would make them wait.
        database["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": RUNWARDEN_DB_POOL_SIZE,
            "timeout": RUNWARDEN_DB_POOL_TIMEOUT_S,  # waiting for a free connection, then 503
            # A connection that cannot be made is retried in the background with a
            # doubling delay; past this the pool gives up and the next request tries at
            # once. Kept short so the first requests after an outage find the database
            # instead of waiting out a backoff that grew during it.
            "reconnect_timeout": RUNWARDEN_DB_POOL_TIMEOUT_S,
        }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(exist_ok=True)
    DATABASES["default"]["OPTIONS"] = {
        # Concurrent writers (server threads, in-process workers) need WAL, a busy
        # timeout, and IMMEDIATE transactions so a reader never upgrades to a writer
        # mid-transaction and dies with "database is locked".
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not shared-cache memory: threads in tests need real WAL locking. One file
    # per test process, so two suites on one machine never share a database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
elif os.environ.get("TEST_DATABASE_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["TEST_DATABASE_NAME"]}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- channel layer ----------------------------------------------------------------------
REDIS_URL = env.url("REDIS_URL", "", schemes={"redis", "rediss", "unix"})
# Redis pub/sub ignores the DB number in REDIS_URL, so two deployments on one Redis are
# kept apart by the prefix alone: by default one derived from the database this
# deployment uses (`rw_` + a hash of its host, port and name).
RUNWARDEN_CHANNEL_PREFIX = os.environ.get("RUNWARDEN_CHANNEL_PREFIX") or env.channel_prefix(DATABASES["default"])
if REDIS_URL:
    # The pub/sub layer: lower latency and, unlike the core layer, it does not drop
    # group messages silently when a channel is over capacity.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # A prefix per deployment (or per test suite) keeps group names apart.
            "CONFIG": {"hosts": [REDIS_URL], "prefix": RUNWARDEN_CHANNEL_PREFIX},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- auth, i18n, static -----------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out user name + address
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.number("RUNWARDEN_LOGIN_FAILURES", 5, minimum=1, cast=int)
AXES_COOLOFF_TIME = timedelta(seconds=env.number("RUNWARDEN_LOGIN_COOLOFF_S", 900.0, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked.html"
AXES_HTTP_RESPONSE_CODE = 429
# The client's address: REMOTE_ADDR, or the forwarded one only when REMOTE_ADDR is a
# proxy in RUNWARDEN_TRUSTED_PROXIES (else anyone could pick an address per attempt).
AXES_CLIENT_IP_CALLABLE = "dashboard.clientip.client_ip"
AXES_VERBOSE = False
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# `manage.py collectstatic` writes hashed, compressed copies here; with DEBUG=0 the pages
# link to them (and a server refuses to start without them). DEBUG serves from the sources.
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or VAR_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "servestatic.storage.CompressedManifestStaticFilesStorage"},
}

# --- email (password reset only when a mail server is configured) ----------------------
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = env.number("EMAIL_PORT", 587, minimum=1, cast=int)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env.boolean("EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "runwarden@localhost")

# --- proxy, TLS, security headers -------------------------------------------------------
# Behind a TLS proxy: the public origin(s), e.g. https://runwarden.example. Form posts and
# the WebSocket Origin check accept them (as well as ALLOWED_HOSTS over plain http).
CSRF_TRUSTED_ORIGINS = env.origins("CSRF_TRUSTED_ORIGINS")
# Opt-in, only behind a proxy that sets (and overwrites) the header: believing a client's
# own X-Forwarded-Proto would let it claim https.
if env.boolean("SECURE_PROXY_SSL_HEADER"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = env.boolean("USE_X_FORWARDED_HOST")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.boolean("SECURE_COOKIES")
SECURE_SSL_REDIRECT = env.boolean("SECURE_SSL_REDIRECT")
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]  # scraped over plain http on the private side
SECURE_HSTS_SECONDS = env.number("SECURE_HSTS_SECONDS", 0, cast=int)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.boolean("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env.boolean("SECURE_HSTS_PRELOAD")
# Proxies whose X-Forwarded-For names the client (login throttling); empty: none.
RUNWARDEN_TRUSTED_PROXIES = env.networks("RUNWARDEN_TRUSTED_PROXIES", [])
# Request bodies past this are refused with 413 before they are read (dashboard/limits.py).
RUNWARDEN_MAX_BODY_BYTES = env.number("RUNWARDEN_MAX_BODY_BYTES", 2 * 1024 * 1024, minimum=1024, cast=int)
# No inline script or style anywhere: htmx's indicator <style> is off (base.html's
# htmx-config) and live.js is a file. The WebSocket is same-origin, which 'self' covers.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# --- logging ----------------------------------------------------------------------------
# One handler, on the root logger: daphne's own (basicConfig) is replaced, and every
# logger propagates to it, so each line is printed once. Expected refusals (a bad Host,
# a CSRF failure) are one line without a traceback. RUNWARDEN_LOG_FORMAT=json: one JSON
# object per line.
RUNWARDEN_LOG_FORMAT = env.choice("RUNWARDEN_LOG_FORMAT", "plain", {"plain", "json"})
RUNWARDEN_LOG_LEVEL = env.choice("RUNWARDEN_LOG_LEVEL", "info", {"debug", "info", "warning", "error"}).upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "refusals": {"()": "dashboard.logs.ExpectedRefusals"},
        "layer_outage": {"()": "dashboard.logs.LayerOutage"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": RUNWARDEN_LOG_FORMAT,
                    "filters": ["refusals", "layer_outage"]},
    },
    "root": {"handlers": ["console"], "level": RUNWARDEN_LOG_LEVEL},
    # Django's defaults give "django" a handler of its own (printing twice with DEBUG)
    # and mail_admins; here it only propagates.
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.server": {"handlers": [], "level": "INFO", "propagate": True},
        # axes logs every successful log-in's reset at INFO; lockouts are WARNING.
        "axes": {"level": "WARNING"},
        # The pool warns on every failed attempt (several a second in an outage);
        # dashboard.outage says it once on the way down and once on the way back.
        "psycopg.pool": {"level": "ERROR"},
    },
}

# --- runwarden ------------------------------------------------------------------------
RUNWARDEN_HEARTBEAT_S = env.number("RUNWARDEN_HEARTBEAT_S", 1.0, minimum=0.05)
RUNWARDEN_STUCK_S = env.number("RUNWARDEN_STUCK_S", 5 * RUNWARDEN_HEARTBEAT_S, minimum=0.1)
RUNWARDEN_REAP_S = env.number("RUNWARDEN_REAP_S", 60.0, minimum=0.1)
RUNWARDEN_CANCEL_GRACE_S = env.number("RUNWARDEN_CANCEL_GRACE_S", 30.0, minimum=0.1)
# After the grace the worker is told to stop hard; this much later the run is retired.
RUNWARDEN_CANCEL_ESCALATE_S = env.number("RUNWARDEN_CANCEL_ESCALATE_S", 30.0, minimum=0.1)
RUNWARDEN_WATCHDOG_S = env.number("RUNWARDEN_WATCHDOG_S", 2.0, minimum=0.05)
# Loop and no-progress detection (runs.loops), per agent unless its AgentPolicy says
# otherwise: the same tool with the same arguments N times in a row; K failed tool
# calls in a row; no committed or discarded step (nor streamed API text) for T seconds
# while the run keeps heartbeating.
RUNWARDEN_LOOP_REPEAT = env.number("RUNWARDEN_LOOP_REPEAT", 3, minimum=2, cast=int)
RUNWARDEN_LOOP_FAILURES = env.number("RUNWARDEN_LOOP_FAILURES", 3, minimum=1, cast=int)
RUNWARDEN_NO_PROGRESS_S = env.number("RUNWARDEN_NO_PROGRESS_S", 600.0, minimum=1)
# How long a process trusts its answer to "which agents reached a 24 h cap" (runs/agent_caps.py); 0: never.
RUNWARDEN_AGENT_CAPS_MEMO_S = env.number("RUNWARDEN_AGENT_CAPS_MEMO_S", 2.0, minimum=0)
# /metrics: a bearer token, or an address in the allowlist (default: this machine only).
RUNWARDEN_METRICS_TOKEN = os.environ.get("RUNWARDEN_METRICS_TOKEN", "")
RUNWARDEN_METRICS_ALLOW = env.networks("RUNWARDEN_METRICS_ALLOW", ["127.0.0.1", "::1"])

# --- engine -----------------------------------------------------------------------------
# The agent engine (runs.agent) and its workers; see README "The worker".
RUNWARDEN_EMBEDDED = env.boolean("RUNWARDEN_EMBEDDED")  # run workers inside the server process
RUNWARDEN_EMBEDDED_CONCURRENCY = env.number("RUNWARDEN_EMBEDDED_CONCURRENCY", 4, minimum=1, cast=int)
RUNWARDEN_DEMO = env.boolean("RUNWARDEN_DEMO", RUNWARDEN_EMBEDDED)  # the embedded demo feeder
RUNWARDEN_WORKSPACE = Path(os.environ.get("RUNWARDEN_WORKSPACE") or VAR_DIR / "workspace")  # write_file's folder
RUNWARDEN_OPENAI_BASE_URL = env.url("OPENAI_BASE_URL", "https://api.openai.com/v1", schemes={"http", "https"})
RUNWARDEN_OPENAI_API_KEY = os.environ.get("OPENAI_API_KEY", "")
RUNWARDEN_OPENAI_MODEL = os.environ.get("RUNWARDEN_OPENAI_MODEL", "gpt-4o-mini")
RUNWARDEN_RETRIES = env.number("RUNWARDEN_RETRIES", 2, cast=int)  # provider attempts after the first
RUNWARDEN_BACKOFF_BASE_S = env.number("RUNWARDEN_BACKOFF_BASE_S", 0.5)
RUNWARDEN_BACKOFF_MAX_S = env.number("RUNWARDEN_BACKOFF_MAX_S", 8.0)
RUNWARDEN_RETRY_AFTER_MAX_S = env.number("RUNWARDEN_RETRY_AFTER_MAX_S", 120.0)  # longest Retry-After honoured
RUNWARDEN_STREAM_FIRST_EVENT_S = env.number("RUNWARDEN_STREAM_FIRST_EVENT_S", 30.0, minimum=0.01)
RUNWARDEN_STREAM_IDLE_S = env.number("RUNWARDEN_STREAM_IDLE_S", 30.0, minimum=0.01)
RUNWARDEN_REQUEST_TIMEOUT_S = env.number("RUNWARDEN_REQUEST_TIMEOUT_S", 60.0, minimum=0.01)
RUNWARDEN_TOOL_TIMEOUT_S = env.number("RUNWARDEN_TOOL_TIMEOUT_S", 60.0, minimum=0.01)
RUNWARDEN_TOOL_WAVE = env.number("RUNWARDEN_TOOL_WAVE", 4, minimum=1, cast=int)  # parallel calls per wave
RUNWARDEN_APPROVAL_TIMEOUT_S = env.number("RUNWARDEN_APPROVAL_TIMEOUT_S", 300.0, minimum=0.01)
RUNWARDEN_PROGRESS_HZ = env.number("RUNWARDEN_PROGRESS_HZ", 10.0, minimum=0.1)  # deltas/s per run, at most
RUNWARDEN_BREAKER_THRESHOLD = env.number("RUNWARDEN_BREAKER_THRESHOLD", 5, minimum=1, cast=int)
RUNWARDEN_BREAKER_RESET_S = env.number("RUNWARDEN_BREAKER_RESET_S", 30.0)
RUNWARDEN_SHUTDOWN_GRACE_S = env.number("RUNWARDEN_SHUTDOWN_GRACE_S", 10.0)
RUNWARDEN_CLAIM_POLL_S = env.number("RUNWARDEN_CLAIM_POLL_S", 0.5, minimum=0.01)
# A worker's PostgreSQL connections, all told, whatever its concurrency (runs' calls
# queue for them); half are kept for cancels' settles and the heartbeat. 4 workers: 32.
RUNWARDEN_WORKER_DB_CONNECTIONS = env.number("RUNWARDEN_WORKER_DB_CONNECTIONS", 8, minimum=2, cast=int)
RUNWARDEN_DENIED_TOOLS = tuple(t.strip() for t in os.environ.get("RUNWARDEN_DENIED_TOOLS", "shell").split(",") if t.strip())

# Alerts (runs/alerts, docs/alerts.md): a webhook's timeout per attempt, the backoff
# between attempts (base · 2^n, capped), when an undelivered alert is given up, and the
# dashboard's public address for the run links in alert bodies (else a bare path).
RUNWARDEN_ALERT_TIMEOUT_S = env.number("RUNWARDEN_ALERT_TIMEOUT_S", 5.0, minimum=0.1)
RUNWARDEN_ALERT_BACKOFF_S = env.number("RUNWARDEN_ALERT_BACKOFF_S", 10.0, minimum=0.01)
RUNWARDEN_ALERT_BACKOFF_MAX_S = env.number("RUNWARDEN_ALERT_BACKOFF_MAX_S", 3600.0, minimum=0.01)
RUNWARDEN_ALERT_GIVE_UP_S = env.number("RUNWARDEN_ALERT_GIVE_UP_S", 86400.0, minimum=1)
RUNWARDEN_PUBLIC_URL = env.url("RUNWARDEN_PUBLIC_URL", "", schemes={"http", "https"})
