"""The supervisor moves what its start-up made out of the garbage collector's reach
before its scheduler threads start: a full collection walks the whole heap
while holding the GIL, and over the ~100,000 objects of the imports, the floor and the
handler it stalled the scheduler's beat (and with it the fold) by 70-150 ms. Start-up's
garbage is collected first: frozen, a cycle holding a connection would never close it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import gc, logging, os, signal, sys
from echomq.floor import Floor
from echomq.supervisor.arbiter import Arbiter
from echomq.supervisor.scheduler import make_factory
from echomq.supervisor.settings import QueueSpec, Settings

redis_url, queue, floor_url = sys.argv[1:4]
settings = Settings(redis_url=redis_url, floor_url=floor_url,
                    queues=(QueueSpec(name=queue, handler="json:dumps", processes=1),))
floor = Floor.from_url(floor_url)
gc.disable()  # no automatic collection: only the supervisor's own may take the garbage
gc.collect()
made = len(gc.get_objects())  # what start-up made and keeps, before the supervisor


class Holder:  # start-up garbage in a cycle, as an engine holding a connection may be
    def __init__(self):
        self.me = self

    def __del__(self):
        print("garbage", flush=True)


Holder()
factory = make_factory(settings, floor)


def scheduler(rt):  # the scheduler thread starts here
    print(gc.get_freeze_count(), made, flush=True)
    return factory(rt)


arbiter = Arbiter(settings, floor=floor, scheduler_factory=scheduler)


class AtStart(logging.Handler):
    def emit(self, record):
        if getattr(record, "event", None) == "start":
            os.kill(os.getpid(), signal.SIGTERM)


log = logging.getLogger("echomq")
log.addHandler(AtStart())
log.setLevel(logging.INFO)
sys.exit(arbiter.run())
'''


def test_the_start_up_heap_is_frozen_before_the_scheduler_threads_start(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    floor_url = f"sqlite:///{tmp_path / 'floor.db'}"
    migrated = subprocess.run([sys.executable, "-m", "echomq.supervisor.cli", "migrate",
                               "--floor-url", floor_url], capture_output=True, text=True,
                              timeout=60)
    assert migrated.returncode == 0, migrated.stderr
    script = tmp_path / "sup.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), redis_url, queue_name, floor_url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:1] == ["garbage"], done.stdout  # collected before the freeze, not kept
    frozen, made = (int(x) for x in lines[1].split())
    assert frozen >= made, (frozen, made)
