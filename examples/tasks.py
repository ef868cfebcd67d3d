"""Example handlers for ``echomq-supervisor start --handler examples.tasks:handle``."""

from __future__ import annotations

import hashlib
import logging

from echomq import Job

log = logging.getLogger("examples.tasks")


def handle(job: Job) -> dict[str, object]:
    """Dispatch on the job's name: ``resize`` hashes some bytes, ``flaky`` fails its first try."""
    if job.name == "resize":
        digest = hashlib.sha256(str(job.payload).encode() * 1000).hexdigest()
        return {"digest": digest[:16]}
    if job.name == "flaky" and job.attempts == 1:
        raise RuntimeError("transient failure on the first attempt")
    return {"ok": True, "attempt": job.attempts}
