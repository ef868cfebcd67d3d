"""Testing helpers: run a queue's jobs in the test's own process, on the real server.

>>> jid = send_email.send("a@b.c", subject="hi")
>>> [job] = echomq.testing.run_jobs(queue, tasks=[send_email], raise_on_failure=True)
>>> job.state, job.result
('completed', {...})

``run_jobs`` is a standalone :class:`echomq.Consumer` run in burst mode: the same
claim, settle, retry and promote scripts as production, no fake broker. The pytest
plugin (``echomq.testing.pytest_plugin``, loaded by ``pip install echomq``) gives the
``echomq_server`` and ``echomq_queue`` fixtures.
"""

from __future__ import annotations

from echomq.testing.runjobs import JobsFailed, make_due, run_jobs

__all__ = ["JobsFailed", "make_due", "run_jobs"]
