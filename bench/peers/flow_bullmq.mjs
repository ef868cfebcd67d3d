// BullMQ's flow (a parent waiting for N children) for bench/workflows.py's comparison.
//
//   NODE_PATH=/path/to/node_modules node bench/peers/flow_bullmq.mjs --url redis://... \
//       --members 10000 [--crash] [--timeout 120]
//
// Runs two worker processes (this file with --worker, restarted when one exits), adds a
// flow: parent "total" with N "noop" children, and waits for the parent. --crash: one
// child process.exit(1)s its worker on its first run (a Redis counter tells runs apart);
// the workers use stalledInterval 1000 ms so a stalled child is re-run soon. Prints one
// JSON line: seconds to the parent's completion (null if it never ran) and its run count.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH || "node_modules", "..", "x.js"));
const { FlowProducer, Queue, QueueEvents, Worker } = require("bullmq");
const IORedis = require("ioredis");

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : dflt;
};
const url = new URL(arg("--url", "redis://127.0.0.1:6379/0"));
const connection = { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };
const QUEUE = "flowbench";

if (process.argv.includes("--worker")) {
  const r = new IORedis(connection);
  new Worker(QUEUE, async (job) => {
    if (job.name === "noop") {
      if (job.data.crash && (await r.incr("flow:crash-runs")) === 1) process.exit(1);
      return 1;
    }
    await r.incr("flow:callback-runs");
    const values = Object.values(await job.getChildrenValues());
    return values.reduce((a, b) => a + b, 0);
  }, { connection, concurrency: 1, stalledInterval: 1000, maxStalledCount: 1 });
} else {
  const members = Number(arg("--members", "10000"));
  const crash = process.argv.includes("--crash");
  const timeoutMs = Number(arg("--timeout", "120")) * 1000;
  const r = new IORedis(connection);
  await r.flushall();
  let stopping = false;
  const workers = [];
  const startWorker = () => {
    const w = spawn(process.execPath, [process.argv[1], "--worker", "--url", url.href],
      { stdio: "ignore", env: process.env });
    w.on("exit", () => { if (!stopping) workers.push(startWorker()); });
    return w;
  };
  workers.push(startWorker(), startWorker());
  const events = new QueueEvents(QUEUE, { connection });
  await events.waitUntilReady();
  const t0 = performance.now();
  const crashAt = crash ? Math.floor(members / 2) : -1;
  const flow = await new FlowProducer({ connection }).add({
    name: "total", queueName: QUEUE, data: {},
    children: Array.from({ length: members }, (_, i) => (
      { name: "noop", queueName: QUEUE, data: { i, crash: i === crashAt } })),
  });
  let seconds = null, value = null;
  try {
    value = await flow.job.waitUntilFinished(events, timeoutMs);
    seconds = (performance.now() - t0) / 1000;
  } catch (e) { value = String(e).slice(0, 120); }
  await new Promise((ok) => setTimeout(ok, 2000));  // a late second run would show here
  const runs = Number(await r.get("flow:callback-runs") || 0);
  console.log(JSON.stringify({ system: "bullmq", members, crash, seconds, value,
    callback_runs: runs }));
  stopping = true;
  for (const w of workers) w.kill("SIGTERM");
  await events.close(); await r.quit();
  process.exit(0);
}
