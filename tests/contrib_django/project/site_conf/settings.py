"""A small Django project using echomq.contrib.django; the database comes from
SHOP_DATABASE_URL (sqlite:///PATH or postgresql://USER@HOST:PORT/NAME)."""

import os
from urllib.parse import urlsplit

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "site_conf.urls"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "echomq.contrib.django",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]


def _database(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # several processes write (the site, consumers, the outbox relay): writers queue
        # for the lock instead of failing at once on an upgrade from read to write
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parts.path,
                "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"}}
    return {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
            "USER": parts.username or "", "PASSWORD": parts.password or "",
            "HOST": parts.hostname or "", "PORT": str(parts.port or "")}


DATABASES = {"default": _database(os.environ["SHOP_DATABASE_URL"])}
if os.environ.get("SHOP_PERSISTENT_CONNECTIONS"):  # kept open across jobs, checked on reuse
    DATABASES["default"].update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True)

ECHOMQ = {
    "REDIS_URL": os.environ["ECHOMQ_REDIS_URL"],
    "SUPERVISOR": ["--beat-ms", "200"],
    "ADMIT": os.environ.get("SHOP_ADMIT", "on_commit"),
    "DEFAULTS": {"max_attempts": 5},  # every queue the project makes without settings
}
