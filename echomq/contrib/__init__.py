"""Integrations with other tools, each behind its own install extra:
``echomq.contrib.django``, ``echomq.contrib.sentry``."""
