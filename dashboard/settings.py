"""Runwarden settings: the embedded default (SQLite, in-memory layer) unless the
environment names PostgreSQL (`DATABASE_URL`) and Redis (`REDIS_URL`)."""

import os
from pathlib import Path

import dj_database_url
import django

from dashboard import env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

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
    "channels",
    "django_htmx",
    "ninja",  # serves the API docs page's assets locally: nothing loads from a CDN
    "runs",
    "dashboard",
]
if django.VERSION < (6, 0):  # partials are built into Django 6
    INSTALLED_APPS.append("template_partials")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "dashboard.middleware.RejectNulBytes",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
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
if REDIS_URL:
    # The pub/sub layer: lower latency and, unlike the core layer, it does not drop
    # group messages silently when a channel is over capacity.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # A prefix per deployment (or per test suite) keeps group names apart.
            "CONFIG": {"hosts": [REDIS_URL], "prefix": os.environ.get("RUNWARDEN_CHANNEL_PREFIX", "runwarden")},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- auth, i18n, static -----------------------------------------------------------------
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
STATIC_ROOT = VAR_DIR / "static"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"runs": {"handlers": ["console"], "level": "INFO", "propagate": True}},
}

# --- runwarden ------------------------------------------------------------------------
RUNWARDEN_HEARTBEAT_S = env.number("RUNWARDEN_HEARTBEAT_S", 1.0, minimum=0.05)
RUNWARDEN_STUCK_S = env.number("RUNWARDEN_STUCK_S", 5 * RUNWARDEN_HEARTBEAT_S, minimum=0.1)
RUNWARDEN_REAP_S = env.number("RUNWARDEN_REAP_S", 60.0, minimum=0.1)
RUNWARDEN_CANCEL_GRACE_S = env.number("RUNWARDEN_CANCEL_GRACE_S", 30.0, minimum=0.1)
RUNWARDEN_WATCHDOG_S = env.number("RUNWARDEN_WATCHDOG_S", 2.0, minimum=0.05)
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
RUNWARDEN_DB_POOL_SIZE = env.number("RUNWARDEN_DB_POOL_SIZE", 8, minimum=2, cast=int)
RUNWARDEN_DENIED_TOOLS = tuple(t.strip() for t in os.environ.get("RUNWARDEN_DENIED_TOOLS", "shell").split(",") if t.strip())
