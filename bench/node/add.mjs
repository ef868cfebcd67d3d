// Admit throughput of the Node client against BullMQ on the same private Valkey, side by
// side in one run: add() one by one (each awaited) and addMany() / addBulk() in batches.
//
//   (cd clients/node && npm ci && npm run build) && (cd bench/node && npm ci)
//   node bench/node/add.mjs [--runs 3] [--single 5000] [--bulk 50000] [--batch 1000]
//
// Reports jobs/s as median (min-max) of the runs, the ratio EchoMQ / BullMQ, and CPU per
// job (this client process, and the server from INFO cpu): the machine may be shared.
import { parseArgs } from "node:util";
import { Queue as BullQueue } from "bullmq";
import Redis from "ioredis";
import { Queue } from "echomq";
import { startServer } from "../../clients/node/test/helpers.mjs";

const { values: opts } = parseArgs({
  options: {
    runs: { type: "string", default: "3" },
    single: { type: "string", default: "5000" },
    bulk: { type: "string", default: "50000" },
    batch: { type: "string", default: "1000" },
  },
});
const RUNS = Number(opts.runs);
const SINGLE = Number(opts.single);
const BULK = Number(opts.bulk);
const BATCH = Number(opts.batch);

async function serverCpu(r) {
  const info = await r.info("cpu");
  const get = (k) => Number(new RegExp(`${k}:([0-9.]+)`).exec(info)[1]);
  return get("used_cpu_user") + get("used_cpu_sys");
}

async function measure(r, jobs, fn) {
  const cpu0 = process.cpuUsage();
  const srv0 = await serverCpu(r);
  const t0 = performance.now();
  await fn();
  const wall = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const srv = (await serverCpu(r)) - srv0;
  return {
    rate: jobs / wall,
    clientUs: (cpu.user + cpu.system) / jobs,
    serverUs: (srv * 1e6) / jobs,
  };
}

/** A BullMQ queue on a connection of its own, closed with it. */
function bullQueue(url, tag) {
  const connection = new Redis(url, { maxRetriesPerRequest: null });
  const q = new BullQueue(`bench-${tag}`, { connection });
  return { add: (...a) => q.add(...a), addBulk: (...a) => q.addBulk(...a),
    close: async () => { await q.close(); connection.disconnect(); } };
}

const contenders = {
  "echomq add": async (url, tag) => {
    const q = new Queue(`bench-${tag}`, { url });
    await q.add("warm", { i: -1 });
    return [q, () => (async () => { for (let i = 0; i < SINGLE; i++) await q.add("noop", { i }); })(), SINGLE];
  },
  "bullmq add": async (url, tag) => {
    const q = bullQueue(url, tag);
    await q.add("warm", { i: -1 });
    return [q, () => (async () => { for (let i = 0; i < SINGLE; i++) await q.add("noop", { i }); })(), SINGLE];
  },
  "echomq addMany": async (url, tag) => {
    const q = new Queue(`bench-${tag}`, { url });
    await q.add("warm", { i: -1 });
    return [q, async () => {
      for (let s = 0; s < BULK; s += BATCH) {
        await q.addMany(Array.from({ length: BATCH }, (_, i) => ({ name: "noop", payload: { i: s + i } })));
      }
    }, BULK];
  },
  "bullmq addBulk": async (url, tag) => {
    const q = bullQueue(url, tag);
    await q.add("warm", { i: -1 });
    return [q, async () => {
      for (let s = 0; s < BULK; s += BATCH) {
        await q.addBulk(Array.from({ length: BATCH }, (_, i) => ({ name: "noop", data: { i: s + i } })));
      }
    }, BULK];
  },
};

const results = Object.fromEntries(Object.keys(contenders).map((k) => [k, []]));
const server = await startServer();
const r = new Redis(server.url);
try {
  for (let run = 0; run < RUNS; run++) {
    const names = Object.keys(contenders);
    if (run % 2) names.reverse(); // alternate the order between runs
    for (const name of names) {
      const [q, fn, jobs] = await contenders[name](server.url, `${run}-${name.replace(/ /g, "-")}`);
      results[name].push(await measure(r, jobs, fn));
      await q.close();
      await r.flushall();
    }
  }
} finally {
  r.disconnect();
  await server.stop();
}

const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (xs, d = 0) => `${med(xs).toFixed(d)} (${Math.min(...xs).toFixed(d)}-${Math.max(...xs).toFixed(d)})`;
console.log(`Node admit throughput, ${RUNS} runs, median (min-max); single ${SINGLE} jobs, bulk ${BULK} in batches of ${BATCH}`);
console.log("| client | jobs/s | client CPU us/job | server CPU us/job |");
console.log("|---|---|---|---|");
for (const [name, rs] of Object.entries(results)) {
  console.log(`| ${name} | ${fmt(rs.map((x) => x.rate))} | ${fmt(rs.map((x) => x.clientUs), 1)} | ${fmt(rs.map((x) => x.serverUs), 1)} |`);
}
for (const [a, b] of [["echomq add", "bullmq add"], ["echomq addMany", "bullmq addBulk"]]) {
  const ratios = results[a].map((x, i) => x.rate / results[b][i].rate);
  console.log(`${a} / ${b}: ${fmt(ratios, 2)}x throughput`);
}
