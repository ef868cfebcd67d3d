"""``manage.py echomq_supervisor`` and ``manage.py echomq``."""
