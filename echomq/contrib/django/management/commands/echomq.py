"""``python manage.py echomq COMMAND ...``: the ``echomq`` CLI on this project's server."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):  # type: ignore[misc]  # Django has no type hints
    """See the module docstring."""

    help = ("The echomq command line (queues, jobs, get, retry, cancel, pause, ...) on "
            "settings.ECHOMQ['REDIS_URL']; every option of echomq is passed through.")

    def run_from_argv(self, argv: list[str]) -> None:
        """From manage.py: every argument goes to the command line's own parser."""
        sys.exit(self.run(argv[2:]))

    def handle(self, *args: Any, **options: Any) -> None:
        """From ``call_command``: CommandError on a non-zero exit code."""
        code = self.run([str(a) for a in args])
        if code:
            raise CommandError(f"exit code {code}", returncode=code)

    def run(self, args: list[str]) -> int:
        """Run with these arguments; the exit code."""
        from echomq.contrib.django.apps import echo_settings
        from echomq.ops.cli import main

        argv = list(args)
        url = echo_settings().redis_url
        if url and not any(a.split("=", 1)[0] == "--redis-url" for a in argv):
            argv = ["--redis-url", url, *argv]
        return main(argv)
