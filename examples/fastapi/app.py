"""A FastAPI app that adds jobs from its request handlers through one ``echomq.aio.Queue``.

    uvicorn examples.fastapi.app:app                       # the web service
    echomq-supervisor start --tasks examples.fastapi.tasks  # its workers

- ``POST /reports`` adds a job and answers at once with its id (202);
- ``POST /reports?wait=10`` adds one and answers with its result (504 if it takes longer);
- ``GET /reports/{id}`` is the job's state, progress, result or error;
- ``GET /reports/{id}/events`` streams its progress as server-sent events, then its end.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

import echomq
from echomq import aio
from echomq.task import pack
from examples.fastapi.tasks import QUEUE, build_report

# how long one wait for the job's end lasts before its progress is read again
PROGRESS_EVERY_S = 0.2


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """One queue (one connection pool) for the whole service, closed at shutdown."""
    app.state.queue = aio.Queue(QUEUE)  # ECHOMQ_REDIS_URL, else the local default
    try:
        yield
    finally:
        await app.state.queue.close()


app = FastAPI(title="reports", lifespan=lifespan)


class ReportRequest(BaseModel):
    rows: int = Field(ge=0, le=100_000)
    seconds_per_row: float = Field(default=0.0, ge=0, le=10)


def queue_of(request: Request) -> aio.Queue:
    queue: aio.Queue = request.app.state.queue
    return queue


@app.post("/reports", status_code=202)
async def add_report(body: ReportRequest, request: Request, wait: float | None = None
                     ) -> JSONResponse:
    """Add a report job; with ``?wait=SECONDS``, answer with its result."""
    queue = queue_of(request)
    # the task's job, through the service's own queue (build_report.asend(...) would
    # use a pool of the event loop's instead)
    job_id = await queue.add(build_report.name,
                             pack((body.rows,), {"seconds_per_row": body.seconds_per_row}))
    if wait is None:
        return JSONResponse({"job": job_id}, status_code=202)
    try:
        result = await queue.result(job_id, timeout=wait)
    except TimeoutError:
        raise HTTPException(504, detail={"job": job_id, "error": "not done yet"}) from None
    except echomq.JobFailed as exc:
        raise HTTPException(500, detail={"job": job_id, "error": str(exc)}) from None
    return JSONResponse({"job": job_id, "result": result}, status_code=200)


@app.get("/reports/{job_id}")
async def get_report(job_id: str, request: Request) -> dict[str, Any]:
    """The job as it stands."""
    job = await _job(queue_of(request), job_id)
    return {"job": job.id, "state": job.state, "attempts": job.attempts,
            "progress": job.progress, "result": job.result, "error": job.error}


@app.get("/reports/{job_id}/events")
async def report_events(job_id: str, request: Request) -> StreamingResponse:
    """Server-sent events: ``progress`` each time it changes, then ``completed`` (with the
    result) or ``failed`` (with the error)."""
    queue = queue_of(request)
    await _job(queue, job_id)  # 404 before the stream starts
    return StreamingResponse(_events(queue, job_id), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


async def _events(queue: aio.Queue, job_id: str) -> AsyncIterator[str]:
    last: Any = None
    while True:
        # parked on the job's doorbell (no polling) until it ends or the interval passes;
        # between two waits, the progress the handler last reported is read
        try:
            result = await queue.result(job_id, timeout=PROGRESS_EVERY_S)
        except TimeoutError:
            job = await queue.get(job_id)
            if job is None:
                yield _sse("failed", {"error": "job gone"})
                return
            if job.progress is not None and job.progress != last:
                last = job.progress
                yield _sse("progress", job.progress)
            continue
        except echomq.JobFailed as exc:
            yield _sse("failed", {"error": str(exc)})
            return
        job = await queue.get(job_id)
        if job is not None and job.progress is not None and job.progress != last:
            yield _sse("progress", job.progress)
        yield _sse("completed", result)
        return


async def _job(queue: aio.Queue, job_id: str) -> echomq.Job:
    try:
        job = await queue.get(job_id)
    except echomq.InvalidName:
        raise HTTPException(422, detail=f"not a job id: {job_id!r}") from None
    if job is None:
        raise HTTPException(404, detail=f"no job {job_id}")
    return job


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"
