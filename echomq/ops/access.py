"""Who may act on the dashboard: holders of the operator token ``ECHOMQ_DASHBOARD_TOKEN``.

A request acts (retry, cancel, pause, resume) only when actions are allowed and it
proves the token, compared in constant time, one of two ways:

- ``Authorization: Bearer <token>`` (scripts, curl). A browser never adds that header
  to a request another site makes, so no form token is needed.
- a browser session: the operator enters the token once in the login form; the answer
  sets the cookie ``echomq_session``, an HMAC of the token (never the token itself),
  ``HttpOnly`` and ``SameSite=Strict``. A posted form must carry the cookie and this
  process's form token, so another site cannot post one.

The token appears in no page, log line, error or metric; changing it ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie

from echomq.errors import ConfigError

TOKEN_ENV = "ECHOMQ_DASHBOARD_TOKEN"
MIN_TOKEN_CHARS = 16
COOKIE = "echomq_session"
_SESSION_CONTEXT = b"echomq-dashboard-session-v1"


class Access:
    """The token check for one dashboard; ``form_token`` guards posted forms."""

    def __init__(self, token: str) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"{TOKEN_ENV} is too short: use at least {MIN_TOKEN_CHARS} "
                              "random characters (e.g. python3 -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))')")
        self._session = _session_of(token)
        self.form_token = secrets.token_urlsafe(16)

    def __repr__(self) -> str:
        return "Access(token=***)"

    def token_ok(self, given: str) -> bool:
        """Whether ``given`` is the token (constant time: HMACs of equal length compared)."""
        return hmac.compare_digest(_session_of(given), self._session)

    def bearer_ok(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries ``Authorization: Bearer <token>``."""
        scheme, _, given = headers.get("authorization", "").strip().partition(" ")
        return scheme.lower() == "bearer" and bool(given) and self.token_ok(given.strip())

    def session_ok(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries the session cookie the login set."""
        try:
            jar = SimpleCookie(headers.get("cookie", ""))
        except CookieError:
            return False
        morsel = jar.get(COOKIE)
        return morsel is not None and hmac.compare_digest(morsel.value, self._session)

    def form_ok(self, form: Mapping[str, str]) -> bool:
        """Whether a posted form carries this process's form token."""
        return hmac.compare_digest(form.get("csrf", ""), self.form_token)

    def login_cookie(self) -> str:
        """The ``Set-Cookie`` value that opens a session."""
        return f"{COOKIE}={self._session}; HttpOnly; SameSite=Strict; Path=/"

    @staticmethod
    def logout_cookie() -> str:
        """The ``Set-Cookie`` value that ends a session."""
        return f"{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"


def _session_of(token: str) -> str:
    return hmac.new(token.encode(), _SESSION_CONTEXT, hashlib.sha256).hexdigest()


def access_for(allow_actions: bool, token: str | None = None) -> Access | None:
    """The token check when actions are allowed (None when they are not).

    Args:
        allow_actions: whether the dashboard may retry, cancel, pause and resume.
        token: the operator token; default ``ECHOMQ_DASHBOARD_TOKEN``.

    Raises:
        ConfigError: actions are allowed and no token (or too short a one) is set.
    """
    if not allow_actions:
        return None
    token = os.environ.get(TOKEN_ENV, "") if token is None else token
    if not token:
        raise ConfigError(f"dashboard actions need an operator token: set {TOKEN_ENV} to a "
                          "long random string (anyone who can reach the port could retry, "
                          "cancel, pause or resume otherwise), or drop --allow-actions / "
                          "--dashboard-actions for a read-only dashboard")
    return Access(token)
