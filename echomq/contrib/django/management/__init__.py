"""Django management commands: ``echomq_supervisor`` and ``echomq``."""
