"""Tessera portal settings, read from the environment.

Embedded defaults (SQLite, in-memory channel layer, in-process tasks) make the quickstart work on
a bare machine; production sets DATABASE_URL, REDIS_URL, SECRET_KEY and TESSERA_PROFILE=production.
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {value!r}")


PROFILE = os.environ.get("TESSERA_PROFILE", "development")
if PROFILE not in {"development", "production"}:
    raise ImproperlyConfigured(f"TESSERA_PROFILE must be 'development' or 'production', got {PROFILE!r}")
PRODUCTION = PROFILE == "production"

DEBUG = env_bool("DEBUG", not PRODUCTION)
# Demo mode allows the well-known demo password (seed_demo); never on in production by default.
DEMO_MODE = env_bool("TESSERA_DEMO", DEBUG)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY must be set in the production profile")
    SECRET_KEY = "dev-insecure-" + "x" * 50  # development only; production refuses to start without one

ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "" if PRODUCTION else "*").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_htmx",
    "portal.security",
    "portal.tenancy",
    "portal.fleet",
    "portal.audit",
    "portal.reservations",
    "portal.placement",
    "portal.reports",
    "portal.telemetry",
    "portal.api",
    "portal.web",
    "portal.notifications",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.security.headers.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "portal.security.middleware.SignInThrottleMiddleware",
    "portal.security.middleware.DatabaseUnavailableMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

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

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'var' / 'tessera.sqlite3'}"),
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "0")),
        # A kept connection is checked before reuse, so a restarted server costs no failed request.
        conn_health_checks=True,
    )
}
# PostgreSQL: each process takes its connections from one bounded pool (psycopg_pool) instead of
# opening one per concurrent request, so a burst of requests cannot exhaust the server's
# connections; a request that waits longer than the pool's timeout for one gets a 503 with
# Retry-After (portal.security.unavailable), as does one that finds max_waiting requests queued.
# Size it so that processes × DB_POOL_MAX_SIZE stays under PostgreSQL's max_connections. On by
# default in production; DB_POOL_MAX_SIZE=0 turns it off. Celery workers hold one connection per
# process and take no pool (portal.celery).
DB_POOL_MAX_SIZE = int(os.environ.get("DB_POOL_MAX_SIZE", "20" if PRODUCTION else "0"))
if DB_POOL_MAX_SIZE > 0 and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps the connections; Django returns them
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(int(os.environ.get("DB_POOL_MIN_SIZE", "2")), DB_POOL_MAX_SIZE),
        "max_size": DB_POOL_MAX_SIZE,
        "timeout": float(os.environ.get("DB_POOL_TIMEOUT_S", "5")),
        "max_waiting": int(os.environ.get("DB_POOL_MAX_WAITING", "200")),
        "max_idle": 300.0,
    }
# Seconds a client is told to wait (Retry-After) when the database cannot take its request now.
TESSERA_RETRY_AFTER_S = int(os.environ.get("TESSERA_RETRY_AFTER_S", "5"))
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    (BASE_DIR / "var").mkdir(exist_ok=True)
    # WAL lets readers go on while one process writes; IMMEDIATE transactions take the write lock
    # up front and wait for it (timeout) instead of failing with "database is locked" on upgrade.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", "timeout": 30,
         "transaction_mode": "IMMEDIATE"})

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"

# Every password sign-in (API token, /login/, /admin/) goes through the guards: throttles before
# hashing, demo credentials only in demo mode (portal.security).
AUTHENTICATION_BACKENDS = ["portal.security.backends.GuardedModelBackend"]
TESSERA_SIGNIN_FAILURES_PER_USERNAME = os.environ.get("TESSERA_SIGNIN_FAILURES_PER_USERNAME", "10/15m")
TESSERA_SIGNIN_FAILURES_PER_ADDRESS = os.environ.get("TESSERA_SIGNIN_FAILURES_PER_ADDRESS", "30/15m")
# How many reverse proxies of ours stand in front and append to X-Forwarded-For; the client's
# address is the one the outermost of them saw. 0: REMOTE_ADDR is the client, the header ignored.
TESSERA_TRUSTED_PROXIES = int(os.environ.get("TESSERA_TRUSTED_PROXIES", "0"))

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.tenancy.authentication.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "portal.api.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "portal.api.query.StrictQueryParams",
        "django_filters.rest_framework.DjangoFilterBackend",
    ],
    "DEFAULT_SCHEMA_CLASS": "portal.api.schema.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["portal.api.throttling.WriteRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"writes": os.environ.get("TESSERA_WRITE_RATE", "120/min")},
    "EXCEPTION_HANDLER": "portal.api.exceptions.exception_handler",
    "NUM_PROXIES": TESSERA_TRUSTED_PROXIES,  # anonymous throttles key on the same client address
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tessera API",
    "DESCRIPTION": "Fractional GPU reservations, teams, quotas and the GPU fleet.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "ENUM_NAME_OVERRIDES": {"ReservationStateEnum": "portal.reservations.states.State"},
    # Browsers use the session; API clients are documented with tokens only.
    "AUTHENTICATION_WHITELIST": ["portal.tenancy.authentication.HashedTokenAuthentication"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api.schema.add_error_responses",
    ],
}

# Prepended to the cache's, the channel layer's and Celery's Redis keys (the placement and live keys
# always start "tessera:"), so two installations can share one Redis database. Empty: as before.
REDIS_KEY_PREFIX = os.environ.get("TESSERA_REDIS_PREFIX", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                    "CONFIG": {"hosts": [REDIS_URL], "prefix": REDIS_KEY_PREFIX + "asgi"}}
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": REDIS_KEY_PREFIX}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Celery: the broker is Redis when configured; otherwise tasks run in-process (quickstart).
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", not REDIS_URL)
if REDIS_KEY_PREFIX:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": REDIS_KEY_PREFIX}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

# The cluster backend the placement cycle acts through: "local" (simulated) or "kubernetes".
TESSERA_BACKEND = os.environ.get("TESSERA_BACKEND", "local")
# Set by `manage.py demo` only: where its simulated fleet reads node tokens (portal.fleet.demo_tokens).
TESSERA_DEMO_TOKENS_FILE = os.environ.get("TESSERA_DEMO_TOKENS_FILE", "")
TESSERA_INVENTORY = os.environ.get("TESSERA_INVENTORY", str(BASE_DIR / "deploy" / "inventory" / "demo.yaml"))
# Placement: the engine's policy; the namespace of portal reservations' pods; the simulated
# cluster's state file (shared by web, workers and beat), pod start delay and batch run time.
TESSERA_POLICY = os.environ.get("TESSERA_POLICY", "tessera")
# Fair share counts past use too when this is set (seconds; 0: off): a team's GPU share held over
# the past, decayed with this half-life, is added to what it holds now when the queue is ordered
# (as Kueue's admission fair sharing and KAI's time-based fair share do).
TESSERA_FAIR_SHARE_HALF_LIFE_S = float(os.environ.get("TESSERA_FAIR_SHARE_HALF_LIFE_S", "0"))
# The estimated start walks the work expected over the next 12 h (learnt from the last day's
# submissions) as well as what waits now: more waiting requests get a time (66-85 % against 48-66 %
# in bench/results/fairshare/estimate_backtest.md), at about 3.4 times the forecast's CPU.
TESSERA_FORECAST_ARRIVALS = env_bool("TESSERA_FORECAST_ARRIVALS", True)
TESSERA_NAMESPACE = os.environ.get("TESSERA_NAMESPACE", "tessera")
TESSERA_LOCAL_STATE = os.environ.get("TESSERA_LOCAL_STATE", str(BASE_DIR / "var" / "local-cluster.sqlite3"))
TESSERA_LOCAL_START_S = float(os.environ.get("TESSERA_LOCAL_START_S", "1"))
TESSERA_LOCAL_BATCH_S = float(os.environ.get("TESSERA_LOCAL_BATCH_S", "300"))
# Cluster housekeeping (deleting ended pods, admitting kubectl pods, applying events) runs in its
# own single-flight tasks, never in the placement cycle: one that runs longer than this is stopped
# and the next one starts over, so a hung API server delays only them.
TESSERA_CLUSTER_TASK_LIMIT_S = float(os.environ.get("TESSERA_CLUSTER_TASK_LIMIT_S", "60"))
# Remote GPU shares (scheduler.core.remote, preload/remote): what each portal pod asks of its node
# (counted against a node's allocatable CPU and memory where the node reports them), how old a
# measured link may be before placement ignores it, and the links a remote share needs at least.
TESSERA_POD_CPU_MILLI = int(os.environ.get("TESSERA_POD_CPU_MILLI", "500"))
TESSERA_POD_MEMORY_MIB = int(os.environ.get("TESSERA_POD_MEMORY_MIB", "1024"))
TESSERA_LINK_MAX_AGE_S = int(os.environ.get("TESSERA_LINK_MAX_AGE_S", "3600"))
TESSERA_REMOTE_MIN_MBPS = float(os.environ.get("TESSERA_REMOTE_MIN_MBPS", "1000"))
TESSERA_REMOTE_MAX_RTT_MS = float(os.environ.get("TESSERA_REMOTE_MAX_RTT_MS", "2"))
# The GPU nodes' remote-server secrets, one file per node name (portal.placement.share_tokens), and
# how long a share token lives (a pod restarted after that needs a new placement).
TESSERA_REMOTE_SECRETS_DIR = os.environ.get("TESSERA_REMOTE_SECRETS_DIR", "")
TESSERA_REMOTE_TOKEN_TTL_S = int(os.environ.get("TESSERA_REMOTE_TOKEN_TTL_S", str(30 * 86400)))
# Kubernetes backend: the RuntimeClass of portal pods ("" for none), and the schedulerNames whose pods
# the kubectl path takes (comma-separated; "" for the defaults, scheduler.backends.kubernetes).
TESSERA_RUNTIME_CLASS = os.environ.get("TESSERA_RUNTIME_CLASS", "nvidia")
TESSERA_SCHEDULER_NAMES = os.environ.get("TESSERA_SCHEDULER_NAMES", "")
# How portal pods get their GPU share (scheduler/backends/kubernetes/portal_claims.py): "dra", a
# ResourceClaim of gpu-share.tessera.io; "deviceplugin", the device plugin's slot; "auto", DRA where
# the API server serves resource.k8s.io/v1 and has that DeviceClass (read once per process).
TESSERA_KUBERNETES_SHARING = os.environ.get("TESSERA_KUBERNETES_SHARING", "auto").strip().lower()
if TESSERA_KUBERNETES_SHARING not in ("auto", "deviceplugin", "dra"):
    raise ImproperlyConfigured("TESSERA_KUBERNETES_SHARING must be 'auto', 'deviceplugin' or 'dra', got "
                               f"{os.environ.get('TESSERA_KUBERNETES_SHARING')!r}")
# A finished portal pod is kept this long for the reservation page's log, then deleted.
TESSERA_KEEP_FINISHED_PODS_S = int(os.environ.get("TESSERA_KEEP_FINISHED_PODS_S", "3600"))
# Celery workers keep their database connection between tasks this long (DB_CONN_MAX_AGE wins).
TESSERA_WORKER_CONN_MAX_AGE_S = int(os.environ.get("DB_CONN_MAX_AGE", "600"))

# Telemetry (portal.telemetry.conf has the meaning of each): raw samples kept short, per-minute
# rollups long; a node silent this long is lost; /metrics scraped with this bearer token.
TESSERA_TELEMETRY_RAW_RETENTION_S = int(os.environ.get("TESSERA_TELEMETRY_RAW_RETENTION_S", "3600"))
TESSERA_TELEMETRY_MINUTE_RETENTION_DAYS = int(os.environ.get("TESSERA_TELEMETRY_MINUTE_RETENTION_DAYS", "90"))
TESSERA_NODE_LOST_AFTER_S = int(os.environ.get("TESSERA_NODE_LOST_AFTER_S", "90"))
TESSERA_METRICS_TOKEN = os.environ.get("TESSERA_METRICS_TOKEN", "")
# Without Celery beat (the quickstart) the portal process runs the telemetry upkeep itself.
TESSERA_TELEMETRY_TICKER = env_bool("TESSERA_TELEMETRY_TICKER", CELERY_TASK_ALWAYS_EAGER)
# The largest WebSocket frame or message `portal.serve` accepts: the wire protocol's largest agent
# message (wire.agent_portal.MAX_MESSAGE_BYTES, 1 MiB); browsers send a few hundred bytes.
TESSERA_WS_MAX_MESSAGE_BYTES = int(os.environ.get("TESSERA_WS_MAX_MESSAGE_BYTES", str(1 << 20)))
# The HTTP server (Gunicorn, portal/web_server.py): processes × threads requests at a time. One
# process runs Python on one core at a time; threads overlap a request's database waits.
TESSERA_WEB_PROCESSES = int(os.environ.get("TESSERA_WEB_PROCESSES", "2"))
TESSERA_WEB_THREADS = int(os.environ.get("TESSERA_WEB_THREADS", "4"))

# Notifications (portal.notifications): e-mail through Django's mail backends, SMTP from the
# environment; the demo writes each mail to a file in var/mail/ (its mail page reads them back).
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend" if DEMO_MODE
                               else "django.core.mail.backends.smtp.EmailBackend")
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH", str(BASE_DIR / "var" / "mail"))
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = int(os.environ.get("EMAIL_TIMEOUT_S", "10"))
DEFAULT_FROM_EMAIL = os.environ.get("TESSERA_MAIL_FROM", "Tessera <tessera@localhost>")
# Where mails link to (the portal as its users reach it).
TESSERA_PUBLIC_URL = os.environ.get("TESSERA_PUBLIC_URL", "http://127.0.0.1:8000")
# Per-user webhooks: https only unless plain http is allowed (the demo), never to private addresses
# unless allowed (a portal inside a private network posting to a private chat server), and a timeout per try.
TESSERA_WEBHOOK_ALLOW_HTTP = env_bool("TESSERA_WEBHOOK_ALLOW_HTTP", DEMO_MODE)
TESSERA_WEBHOOK_ALLOW_PRIVATE = env_bool("TESSERA_WEBHOOK_ALLOW_PRIVATE", False)
TESSERA_WEBHOOK_TIMEOUT_S = float(os.environ.get("TESSERA_WEBHOOK_TIMEOUT_S", "5"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # Django and the dev server bring their own handlers; without this every line prints twice.
    "loggers": {
        name: {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO"), "propagate": False}
        for name in ("django", "django.channels.server")
    },
}

if PRODUCTION:
    # Static files served by the app itself (collectstatic first); in development runserver does it.
    MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
