"""The dashboard as a Django view, behind Django's authentication (staff by default)."""

from __future__ import annotations

import threading
from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed

from echomq import pools
from echomq.contrib.django.apps import echo_settings

_lock = threading.Lock()
_dashboard: Any = None


def _shared_dashboard() -> Any:
    """One read-only dashboard per process, sampling rates from its first request on."""
    global _dashboard
    with _lock:
        if _dashboard is None:
            from echomq.ops.dashboard import Dashboard

            _dashboard = Dashboard(pools.client(echo_settings().redis_url)).start()
        return _dashboard


def _page(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":  # read-only here: no action is offered or taken
        return HttpResponseNotAllowed(["GET"])
    query = request.META.get("QUERY_STRING", "")
    status, ctype, body, headers = _shared_dashboard().handle("GET", "/?" + query)
    text = body.decode()
    if ctype.startswith("text/html"):
        text = _mounted(text, request.path)
    response = HttpResponse(text, status=status, content_type=ctype)
    for name, value in headers.items():
        if name.lower() != "set-cookie":
            response[name] = value
    return response


def _mounted(html: str, base: str) -> str:
    """The page's links, written for ``/``, pointed at where the view is mounted."""
    base = base if base.endswith("/") else base + "/"
    return html.replace('href="/?', f'href="{base}?').replace('href="/"', f'href="{base}"') \
        .replace('action="/"', f'action="{base}"')


_login_only = login_required(_page)
_staff_only = staff_member_required(_page)


def dashboard(request: HttpRequest) -> HttpResponse:
    """The queues, their jobs and rates (read-only), for staff users (or any signed-in user
    with ``DASHBOARD_STAFF_ONLY: False``); others are sent to the login page."""
    if echo_settings().dashboard_staff_only:
        return _staff_only(request)
    return _login_only(request)
