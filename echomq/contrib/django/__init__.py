"""EchoMQ in a Django project (extra ``echomq[django]``).

>>> INSTALLED_APPS += ["echomq.contrib.django"]
>>> ECHOMQ = {"REDIS_URL": "redis://127.0.0.1:6379/0", "TASKS": ["shop.tasks"]}

- Inside ``transaction.atomic()``, ``Queue.add``, ``add_many`` and ``task.send()`` are
  admitted when the transaction commits (``on_commit``), and not at all when it rolls
  back; outside a transaction they are admitted at once (setting ``ADMIT``).
- ``python manage.py echomq_supervisor [start] ...`` runs the supervisor with Django set
  up once, before it forks its consumers; ``python manage.py echomq ...`` is the CLI.
- ``path("ops/echomq/", include("echomq.contrib.django.urls"))`` mounts the dashboard
  (read-only) for staff users.

Settings: :mod:`echomq.contrib.django.conf`.
"""
