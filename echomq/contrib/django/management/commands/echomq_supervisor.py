"""``python manage.py echomq_supervisor [start|migrate] [echomq-supervisor options]``."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):  # type: ignore[misc]  # Django has no type hints
    """See the module docstring."""

    help = ("Run the EchoMQ supervisor (echomq-supervisor start ...) with this project's "
            "settings.ECHOMQ; every option of echomq-supervisor is passed through.")

    def run_from_argv(self, argv: list[str]) -> None:
        """From manage.py: every argument goes to the command line's own parser."""
        # the supervisor's own parser reads the options (Django's would refuse them)
        self.check()
        sys.exit(self.run(argv[2:]))

    def handle(self, *args: Any, **options: Any) -> None:
        """From ``call_command``: CommandError on a non-zero exit code."""
        code = self.run([str(a) for a in args])
        if code:
            raise CommandError(f"exit code {code}", returncode=code)

    def run(self, args: list[str]) -> int:
        """Run with these arguments; the exit code."""
        from echomq.contrib.django.supervise import run_supervisor

        return run_supervisor(args)
