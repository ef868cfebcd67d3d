// Admits `jobs` probe jobs with the Node client, `gap` ms apart, each carrying the wall
// clock (s, sub-ms) taken just before its add; bench/node_pickup.py drives it.
//   node bench/node/pickup_add.mjs URL QUEUE JOBS GAP_MS
import { Queue } from "echomq";

const [url, queue, jobs, gapMs] = process.argv.slice(2);
const q = new Queue(queue, { url });
const now = () => (performance.timeOrigin + performance.now()) / 1000;
let next = performance.now();
for (let i = 0; i < Number(jobs); i++) {
  await q.add("probe", { t: now() });
  next += Number(gapMs);
  await new Promise((ok) => setTimeout(ok, Math.max(0, next - performance.now())));
}
await q.close();
