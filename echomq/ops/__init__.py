"""Operating queues: the ``echomq`` command and the dashboard, both clients of ``Queue``."""
