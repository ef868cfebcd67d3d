"""A new Django project to its first job run, as a newcomer types it, timed step by step.

    python bench/django_first_job.py

Uses this interpreter's Django and echomq, and a private Valkey; the project is made in a
temporary folder and removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from echomq.supervisor.drills.localredis import LocalRedis

TASKS = '''import echomq


@echomq.task(queue="hello")
def greet(name: str) -> str:
    return f"hello {name}"
'''
SETTINGS = '''
INSTALLED_APPS += ["echomq.contrib.django", "shop"]
ECHOMQ = {"REDIS_URL": "%s"}
'''
SEND = ("from shop.tasks import greet; jid = greet.send('world'); "
        "print(greet.result(jid, timeout=60))")


def main() -> None:
    server = LocalRedis().start()
    bin_dir = Path(sys.executable).parent
    steps: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": tmp}

        def run(title: str, *cmd: str, cwd: str = tmp) -> str:
            t = time.perf_counter()
            done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                  check=True, timeout=120)
            steps.append((title, time.perf_counter() - t))
            return done.stdout

        start = time.perf_counter()
        run("django-admin startproject mysite .", str(bin_dir / "django-admin"),
            "startproject", "mysite", ".")
        run("python manage.py startapp shop", sys.executable, "manage.py", "startapp", "shop")
        Path(tmp, "shop", "tasks.py").write_text(TASKS)
        with Path(tmp, "mysite", "settings.py").open("a") as settings:
            settings.write(SETTINGS % server.url)
        run("python manage.py migrate", sys.executable, "manage.py", "migrate", "-v", "0")
        t = time.perf_counter()
        sup = subprocess.Popen([sys.executable, "manage.py", "echomq_supervisor"], cwd=tmp,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        steps.append(("python manage.py echomq_supervisor &", time.perf_counter() - t))
        try:
            out = run("manage.py shell -c 'greet.send(...); greet.result(...)'", sys.executable,
                      "manage.py", "shell", "-v", "0", "-c", SEND)
        finally:
            sup.send_signal(signal.SIGTERM)
            sup.wait(timeout=30)
            server.stop()
        total = time.perf_counter() - start
    for title, seconds in steps:
        print(f"{seconds:7.2f} s  {title}")
    print(f"{total:7.2f} s  total (first job's result: {out.strip()!r})")


if __name__ == "__main__":
    main()
