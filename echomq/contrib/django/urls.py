"""``path("ops/echomq/", include("echomq.contrib.django.urls"))``: the dashboard."""

from __future__ import annotations

from django.urls import path

from echomq.contrib.django.views import dashboard

app_name = "echomq"
urlpatterns = [path("", dashboard, name="dashboard")]
