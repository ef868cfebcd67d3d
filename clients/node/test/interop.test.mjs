// Proven both ways, on a private Valkey with the Python supervisor as a real process: a job
// the Node producer admits runs under Python and its result is read in Node; a Python
// producer's job's result is read in Node; the doorbell rings for a Node add.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import Redis from "ioredis";
import {
  JobFailed, JobNotFound, PROTOCOL_VERSION, ProtocolMismatch, Queue, TimeoutError,
} from "../dist/index.js";
import { queueName, runPython, startServer, startSupervisor } from "./helpers.mjs";

let server;
let raw;
before(async () => {
  server = await startServer();
  raw = new Redis(server.url);
});
after(async () => {
  raw?.disconnect();
  await server?.stop();
});

async function withQueue(fn, name = queueName()) {
  const q = new Queue(name, { url: server.url });
  try {
    return await fn(q, name);
  } finally {
    await q.close();
  }
}

test("a Node job runs under the Python supervisor and its result is read in Node", async () => {
  const name = queueName();
  const sup = startSupervisor(server.url, name);
  try {
    await withQueue(async (q) => {
      const id = await q.add("resize", { img: 7, tags: ["a", "é"] }, { lane: "tenant-1", timeout: 30, maxAttempts: 2 });
      const result = await q.result(id, { timeout: 30 });
      assert.deepEqual(result, {
        ran_by: "python", name: "resize", payload: { img: 7, tags: ["a", "é"] }, lane: "tenant-1",
        attempts: 1, timeout: 30,
      });
      const job = await q.get(id);
      assert.equal(job.state, "completed");
      assert.deepEqual(job.result, result);
      const failing = await q.add("fail", {}, { maxAttempts: 1 });
      await assert.rejects(q.result(failing, { timeout: 30 }), (err) => {
        assert.ok(err instanceof JobFailed);
        assert.match(err.message, /boom from python/);
        return true;
      });
    }, name);
  } finally {
    await sup.stop();
  }
});

test("a Python producer's job's result is read in Node", async () => {
  const name = queueName();
  const sup = startSupervisor(server.url, name);
  try {
    await withQueue(async (q) => {
      const id = runPython(
        "import sys, echomq; print(echomq.Queue(sys.argv[1], redis_url=sys.argv[2]).add('from-py', {'n': 1}))",
        [name, server.url],
      ).trim();
      assert.deepEqual(await q.result(id, { timeout: 30 }), {
        ran_by: "python", name: "from-py", payload: { n: 1 }, lane: "default", attempts: 1, timeout: null,
      });
    }, name);
  } finally {
    await sup.stop();
  }
});

test("the Python client reads a Node job as the Python producer would have written it", async () => {
  await withQueue(async (q, name) => {
    const id = await q.add("report", { a: [1, 2] }, { lane: "l1", priority: 5, timeout: 1.5, jobId: "r-1" });
    const py = JSON.parse(runPython(
      "import sys, json, echomq; j = echomq.Queue(sys.argv[1], redis_url=sys.argv[2]).get(sys.argv[3]);"
        + " print(json.dumps([j.name, j.payload, j.lane, j.state, j.priority, j.timeout, j.max_attempts]))",
      [name, server.url, id],
    ));
    assert.deepEqual(py, ["report", { a: [1, 2] }, "l1", "waiting", 5, 1.5, 3]);
    assert.equal(await q.add("report", { other: true }, { jobId: "r-1" }), "r-1");
    assert.deepEqual((await q.get("r-1")).payload, { a: [1, 2] }, "an existing id admits nothing");
  });
});

test("the list doorbell rings for a Node add", async () => {
  await withQueue(async (q, name) => {
    const parked = raw.duplicate();
    try {
      const rung = parked.blpop(`emq:{${name}}:wake`, 10);
      await new Promise((ok) => setImmediate(ok));
      await q.add("ping", null);
      assert.deepEqual(await rung, [`emq:{${name}}:wake`, "1"]);
    } finally {
      parked.disconnect();
    }
  });
});

test("the marker doorbell rings for a Node add when the meta says marker", async () => {
  await withQueue(async (q, name) => {
    await raw.hset(`emq:{${name}}:meta`, "doorbell", "marker");
    const parked = raw.duplicate();
    try {
      const rung = parked.bzpopmin(`emq:{${name}}:marker`, 10);
      await new Promise((ok) => setImmediate(ok));
      await q.add("ping", null);
      assert.deepEqual(await rung, [`emq:{${name}}:marker`, "0", "0"]);
      assert.equal(await raw.llen(`emq:{${name}}:wake`), 0);
    } finally {
      parked.disconnect();
    }
  });
});

test("addMany, counts, delay and cancel go through the same scripts", async () => {
  await withQueue(async (q) => {
    const ids = await q.addMany([
      { name: "a", payload: 1 },
      { name: "b", payload: 2, lane: "x" },
      { name: "c", payload: 3, delay: 60 },
    ]);
    assert.equal(ids.length, 3);
    assert.deepEqual(await q.counts(), { waiting: 2, scheduled: 1, active: 0, completed: 0, dead: 0, cancelled: 0 });
    assert.equal((await q.get(ids[2])).state, "scheduled");
    assert.equal(await q.cancel(ids[2]), true);
    assert.equal(await q.cancel(ids[2]), false);
    assert.equal((await q.get(ids[2])).state, "cancelled");
    await assert.rejects(q.result(ids[2], { timeout: 1 }), JobFailed);
    assert.equal(await q.get("no-such-job"), null);
  });
});

test("addMany admits none when one job is bad", async () => {
  await withQueue(async (q) => {
    await assert.rejects(q.addMany([{ name: "ok", payload: 1 }, { name: "bad", payload: 1, lane: "a b" }]));
    assert.deepEqual(await q.counts(), { waiting: 0, scheduled: 0, active: 0, completed: 0, dead: 0, cancelled: 0 });
  });
});

test("result waits on the doorbell and times out, or finds no job", async () => {
  await withQueue(async (q) => {
    const id = await q.add("never-run", {});
    await assert.rejects(q.result(id, { timeout: 0.2 }), TimeoutError);
    await assert.rejects(q.result("nope", { timeout: 0.2 }), JobNotFound);
  });
});

test("the first add records the protocol version; another major is refused", async () => {
  await withQueue(async (q, name) => {
    await q.add("a", {});
    assert.equal(await raw.hget(`emq:{${name}}:meta`, "protocol"), PROTOCOL_VERSION);
  });
  const name = queueName();
  await raw.hset(`emq:{${name}}:meta`, "protocol", "2.0");
  await withQueue(async (q) => {
    await assert.rejects(q.add("a", {}), ProtocolMismatch);
    await assert.rejects(q.counts(), ProtocolMismatch);
    assert.equal(await raw.exists(`emq:{${name}}:ring`, `emq:{${name}}:lane:default`), 0);
  }, name);
});
