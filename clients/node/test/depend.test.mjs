// Dependencies (after, onDepFailure) and expiry (expires) from the Node producer, through
// block.lua and expire_mark.lua, and cancel through cancel.lua with its included library:
// on a private Valkey, with the Python supervisor and Python client as real processes.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import Redis from "ioredis";
import { JobFailed, Queue, UnknownDependency } from "../dist/index.js";
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

test("cancel of a waiting job (cancel.lua, its deps library expanded)", async () => {
  await withQueue(async (q, name) => {
    const id = await q.add("a", 1);
    assert.equal(await q.cancel(id), true);
    const job = await q.get(id);
    assert.equal(job.state, "cancelled");
    assert.equal(await raw.llen(`emq:{${name}}:lane:default`), 0);
    assert.equal(await q.cancel(id), false);
  });
});

test("a job with after is blocked; cancelling its dependency kills a fail job and releases a run job", async () => {
  await withQueue(async (q, name) => {
    const a = await q.add("a", 1, { jobId: "dep-a" });
    const [b, c] = await q.addMany([
      { name: "b", payload: 2, after: [a] },
      { name: "c", payload: 3, after: [a], onDepFailure: "run" },
    ]);
    assert.equal((await q.get(b)).state, "blocked");
    assert.equal((await q.get(c)).state, "blocked");
    assert.equal(await raw.hget(`emq:{${name}}:job:${a}`, "dependents"), `${b} ${c}`);
    assert.equal(await raw.zcard(`emq:{${name}}:waitdeps`), 2);
    assert.equal(await q.cancel(a), true);
    const dead = await q.get(b);
    assert.equal(dead.state, "dead");
    assert.equal(dead.error, "dependency dep-a cancelled");
    assert.equal((await q.get(c)).state, "waiting");
    assert.equal(await raw.hget(`emq:{${name}}:job:${c}`, "dep:dep-a"), "x");
    assert.equal(await raw.zcard(`emq:{${name}}:waitdeps`), 0);
    await assert.rejects(q.result(b, { timeout: 1 }), JobFailed);
  });
});

test("after an unknown job admits nothing, in add and in addMany", async () => {
  await withQueue(async (q, name) => {
    await assert.rejects(q.add("b", 1, { after: ["nope"] }), (err) => err instanceof UnknownDependency && err.jobId === "nope");
    await assert.rejects(
      q.addMany([{ name: "a", payload: 1, jobId: "x1" }, { name: "b", payload: 2, after: ["x1", "nope"] }]),
      UnknownDependency,
    );
    assert.equal(await q.get("x1"), null);
    assert.equal(await raw.exists(`emq:{${name}}:ring`, `emq:{${name}}:waitdeps`), 0);
  });
});

test("a Node job with after=[a Python-admitted job] runs after it under the Python supervisor", async () => {
  const name = queueName();
  const sup = startSupervisor(server.url, name);
  try {
    await withQueue(async (q) => {
      // due in a second: the Node job is admitted while its dependency has not run yet
      const first = runPython(
        "import sys, echomq; print(echomq.Queue(sys.argv[1], redis_url=sys.argv[2]).add('from-py', {'n': 1}, delay=1))",
        [name, server.url],
      ).trim();
      const second = await q.add("from-node", { n: 2 }, { after: [first] });
      assert.equal((await q.get(second)).state, "blocked");
      assert.deepEqual(await q.result(second, { timeout: 30 }), {
        ran_by: "python", name: "from-node", payload: { n: 2 }, lane: "default", attempts: 1, timeout: null,
      });
      const [a, b] = [await q.get(first), await q.get(second)];
      assert.equal(a.state, "completed");
      assert.ok(b.startedMs >= a.finishedMs, `started ${b.startedMs} before its dependency ended ${a.finishedMs}`);
      const results = JSON.parse(runPython(
        "import sys, json, echomq; from echomq.depend import read_results\n"
          + "q = echomq.Queue(sys.argv[1], redis_url=sys.argv[2]); print(json.dumps(read_results(q.redis, q.keys, sys.argv[3])))",
        [name, server.url, second],
      ));
      assert.deepEqual(results, { [first]: a.result });
    }, name);
  } finally {
    await sup.stop();
  }
});

test("expires marks the job in the admit's transaction, also after SCRIPT FLUSH", async () => {
  await withQueue(async (q, name) => {
    await raw.script("FLUSH");
    const [before] = await raw.time();
    const id = await q.add("a", 1, { expires: 3600 });
    const [after] = await raw.time();
    const at = Number(await raw.hget(`emq:{${name}}:job:${id}`, "expires_ms"));
    assert.ok(at >= Number(before) * 1000 + 3_600_000 && at <= (Number(after) + 1) * 1000 + 3_600_000, String(at));
    assert.equal(Number(await raw.zscore(`emq:{${name}}:expiring`, id)), at);
    const later = await q.add("b", 1, { expires: new Date(Date.UTC(2999, 0, 1)), delay: 60 });
    assert.equal((await q.get(later)).state, "scheduled");
    assert.equal(await raw.hget(`emq:{${name}}:job:${later}`, "expires_ms"), String(Date.UTC(2999, 0, 1)));
  });
});

test("addMany takes an expiry per job, marked in the admit's transaction", async () => {
  await withQueue(async (q, name) => {
    await raw.script("FLUSH");
    const [soon, plain, later] = await q.addMany([
      { name: "a", payload: 1, expires: 3600 },
      { name: "b", payload: 2 },
      { name: "c", payload: 3, expires: new Date(Date.UTC(2999, 0, 1)), delay: 60 },
    ]);
    const marked = (await raw.zrange(`emq:{${name}}:expiring`, 0, -1)).sort();
    assert.deepEqual(marked, [soon, later].sort());
    assert.equal(await raw.hget(`emq:{${name}}:job:${plain}`, "expires_ms"), null);
    assert.equal(await raw.hget(`emq:{${name}}:job:${later}`, "expires_ms"), String(Date.UTC(2999, 0, 1)));
    await assert.rejects(
      q.addMany([{ name: "d", payload: 1, expires: 60 }, { name: "e", payload: 1, after: [soon] }]),
      /after= and expires= cannot be combined/,
    );
    await assert.rejects(q.addMany([{ name: "f", payload: 1, expires: -1 }]), /expires must be/);
    assert.equal((await q.counts()).waiting, 2);
  });
});

test("a job whose expiry passed is cancelled by the Python expiry pass and never runs", async () => {
  await withQueue(async (q, name) => {
    const id = await q.add("a", 1, { expires: new Date(1000) });
    const n = runPython(
      "import sys, echomq; from echomq.expiry import expire_pass\n"
        + "q = echomq.Queue(sys.argv[1], redis_url=sys.argv[2]); print(expire_pass(q.redis, q.keys)[0])",
      [name, server.url],
    ).trim();
    assert.equal(n, "1");
    const job = await q.get(id);
    assert.equal(job.state, "cancelled");
    assert.equal(job.error, "expired");
    await assert.rejects(q.result(id, { timeout: 1 }), (err) => err instanceof JobFailed && err.error === "expired");
  });
});

test("jobs with after over one block.lua call are admitted in one MULTI/EXEC", async () => {
  // no other client's command may run between the calls: a consumer could otherwise run
  // the first members, and retention drop their results, before the callback exists
  await withQueue(async (q, name) => {
    const monitor = await raw.monitor(); // a connection of its own
    const seen = [];
    monitor.on("monitor", (_time, args) => {
      const cmd = String(args[0]).toLowerCase();
      if (["multi", "exec", "evalsha"].includes(cmd) && !String(args[3] ?? "").includes("ledger")) seen.push(cmd);
    });
    try {
      const members = Array.from({ length: 600 }, (_, i) => ({ name: "m", payload: i, jobId: `m${i}` }));
      await q.addMany([...members, { name: "cb", payload: 0, jobId: "cb", after: members.map((m) => m.jobId) }]);
      await raw.ping(); // the monitor has seen everything before this
      await new Promise((ok) => setTimeout(ok, 100));
    } finally {
      monitor.disconnect();
    }
    const first = seen.indexOf("multi");
    assert.ok(first >= 0, `no MULTI in ${seen.join(",")}`);
    assert.deepEqual(seen.slice(first, first + 4), ["multi", "evalsha", "evalsha", "exec"]);
    assert.equal((await q.get("cb")).state, "blocked");
    assert.equal(await raw.hget(`emq:{${name}}:stats`, "waiting"), "600");
  });
});
