// The bad-input table both clients run (tests/clients/cases.json; the Python side in
// tests/clients/test_bad_input_parity.py): same error class, same message, nothing admitted.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import Redis from "ioredis";
import { Queue } from "../dist/index.js";
import { REPO, queueName, startServer } from "./helpers.mjs";

const { cases } = JSON.parse(readFileSync(join(REPO, "tests", "clients", "cases.json"), "utf8"));
const OPTION_NAMES = {
  job_id: "jobId", max_attempts: "maxAttempts", run_at: "runAt", on_dep_failure: "onDepFailure",
};

/** Case options with the Node client's names. */
function options(value) {
  return Object.fromEntries(Object.entries(materialize(value ?? {})).map(([k, v]) => [OPTION_NAMES[k] ?? k, v]));
}

/** A case's value with its special forms ($nan, $set, ...) made real. */
function materialize(value) {
  if (Array.isArray(value)) return value.map(materialize);
  if (value === null || typeof value !== "object") return value;
  const entries = Object.entries(value);
  if (entries.length === 1) {
    const [key, arg] = entries[0];
    if (key === "$nan") return NaN;
    if (key === "$inf") return Infinity;
    if (key === "$circular") {
      const loop = [];
      loop.push(loop);
      return loop;
    }
    if (key === "$set") return new Set(arg);
    if (key === "$datetime") return new Date(arg);
    if (key === "$deep") {
      let deep = 1;
      for (let i = 0; i < arg; i++) deep = [deep];
      return deep;
    }
    if (key === "$repeat") return arg[0].repeat(arg[1]);
  }
  return Object.fromEntries(entries.map(([k, v]) => [k, materialize(v)]));
}

function escapeRegExp(text) {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

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

for (const c of cases) {
  test(`bad input: ${c.case}`, async () => {
    const name = queueName();
    const prefix = `emq:{${name}}:`;
    if (c.protocol !== undefined) await raw.hset(`${prefix}meta`, "protocol", c.protocol);
    const queues = [];
    const call = async () => {
      if (c.call === "queue") {
        queues.push(new Queue(materialize(c.queue), { url: server.url }));
        return [];
      }
      const q = new Queue(name, { url: server.url });
      queues.push(q);
      if (c.call === "add_many") {
        return q.addMany(c.jobs.map(([n, payload, opts]) => ({ name: materialize(n), payload: materialize(payload), ...options(opts) })));
      }
      return [await q.add(materialize(c.name ?? "job"), materialize(c.payload ?? null), options(c.options))];
    };
    try {
      if (c.error === "ok") {
        for (const id of await call()) {
          assert.ok(["waiting", "scheduled", "blocked"].includes(await raw.hget(`${prefix}job:${id}`, "state")));
        }
        return;
      }
      let caught = null;
      try {
        await call();
      } catch (err) {
        caught = err;
      }
      assert.ok(caught, "no error was raised");
      assert.equal(caught.name, c.error, caught.stack);
      if (c.message !== undefined) assert.equal(caught.message, c.message.replaceAll("{queue}", name));
      else assert.match(caught.message, new RegExp(c.match.replaceAll("{queue}", escapeRegExp(name))));
      assert.equal(
        await raw.exists(`${prefix}ring`, `${prefix}schedule`, `${prefix}lane:default`, `${prefix}waitdeps`, `${prefix}expiring`),
        0,
      );
    } finally {
      for (const q of queues) await q.close();
    }
  });
}
