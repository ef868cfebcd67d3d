/** Dependencies (`after`) and expiry (`expires`) of a job, validated by the Python
 * producer's rules (echomq/depend.py, echomq/expiry.py); building calls, no I/O. */
import { randomBytes } from "node:crypto";
import { ADMIT_BATCH, MAX_DELAY_S, MAX_DUE_MS, Spec } from "./admit";
import { InvalidSchedule, UnknownDependency, ValueError, pyRepr } from "./errors";
import { validateJobId } from "./keys";

export const MAX_DEPENDENCIES = 10_000; // dependencies of one job
export const MAX_DEPENDENTS = 1_000; // jobs waiting for one job
export const MAX_DEPTH = 1_000; // blocked jobs in a chain
export const CALL_VALUES = 20_000; // dependency ids per block.lua call
export const ON_DEP_FAILURE = ["fail", "run"] as const;
export type OnDepFailure = (typeof ON_DEP_FAILURE)[number];

/** A job with dependencies: its spec, onDepFailure and its dependency ids. */
export interface Blocked {
  spec: Spec;
  fail: OnDepFailure;
  after: string[];
}

/** Validate `after` (job ids) and `onDepFailure`; the ids, each once, in order. */
export function dependencies(after: unknown, onDepFailure: unknown = "fail"): string[] {
  if (!ON_DEP_FAILURE.includes(onDepFailure as OnDepFailure)) {
    throw new ValueError(`on_dep_failure must be 'fail' or 'run', got ${pyRepr(onDepFailure)}`);
  }
  if (
    typeof after === "string" || after === null || after === undefined ||
    typeof (after as { [Symbol.iterator]?: unknown })[Symbol.iterator] !== "function"
  ) {
    throw new TypeError(`after must be a list of job ids, got ${pyRepr(after).slice(0, 100)}`);
  }
  const ids = [...new Set([...(after as Iterable<unknown>)].map((a) => validateJobId(a)))];
  if (ids.length > MAX_DEPENDENCIES) {
    throw new ValueError(
      `a job may wait for at most ${MAX_DEPENDENCIES.toLocaleString("en-US")} dependencies, ` +
        `got ${ids.length.toLocaleString("en-US")}`,
    );
  }
  return ids;
}

/** One job with dependencies, checked: it cannot also be deferred, nor wait for itself. */
export function blocked(spec: Spec, after: string[], fail: OnDepFailure): Blocked {
  if (spec.due !== null) throw new ValueError("a job with dependencies (after=) cannot also take delay or run_at");
  if (after.includes(spec.id)) throw new ValueError(`job ${pyRepr(spec.id)} cannot depend on itself`);
  return { spec, fail, after };
}

/** block.lua's ARGV per call admitting `jobs` in order. The first call also checks every
 * dependency the batch names from outside it, with the batch's totals (`limits`), so an
 * unknown id or a limit fails before anything is written. */
export function blockArgs(prefix: string, jobs: Blocked[]): string[][] {
  const chunks: Blocked[][] = [];
  let start = 0;
  let values = 0;
  jobs.forEach((job, i) => {
    if (i > start && (i - start >= ADMIT_BATCH || values + job.after.length > CALL_VALUES)) {
      chunks.push(jobs.slice(start, i));
      start = i;
      values = 0;
    }
    values += job.after.length;
  });
  if (start < jobs.length) chunks.push(jobs.slice(start));
  const checks = limits(jobs).flatMap(([d, count, height]) => [d, String(count), String(height)]);
  const batch = chunks.length > 1 ? randomBytes(16).toString("hex") : ""; // a refusal stops the later calls
  return chunks.map((chunk, n) => {
    const extra = n === 0 ? checks : [];
    const args = [prefix, String(chunk.length), batch, String(extra.length / 3), ...extra];
    for (const job of chunk) args.push(...job.spec.args, job.fail, String(job.after.length), ...job.after);
    return args;
  });
}

/** The batch against MAX_DEPENDENTS and MAX_DEPTH as far as it alone decides (ValueError,
 * nothing sent); for each dependency outside it: [id, how many of its jobs wait for it, the
 * longest chain of them below it] (block.lua adds what stands already). As depend.limits. */
export function limits(jobs: Blocked[]): [string, number, number][] {
  const ids = new Set(jobs.map((j) => j.spec.id));
  const below = new Map<string, string[]>();
  for (const job of jobs) {
    for (const d of new Set(job.after)) {
      if (!below.has(d)) below.set(d, []);
      below.get(d)!.push(job.spec.id);
    }
  }
  for (const [d, waiting] of below) {
    if (waiting.length > MAX_DEPENDENTS) {
      throw new ValueError(
        `at most ${MAX_DEPENDENTS.toLocaleString("en-US")} jobs may wait for one job: ` +
          `${waiting.length.toLocaleString("en-US")} wait for ${pyRepr(d)} (nothing was admitted)`,
      );
    }
  }
  const depth = new Map<string, number>();
  for (const job of jobs) {
    const own = Math.max(0, ...job.after.map((d) => (depth.get(d) ?? 0) + 1));
    depth.set(job.spec.id, own);
    if (own > MAX_DEPTH) {
      throw new ValueError(
        `a chain of blocked jobs may be at most ${MAX_DEPTH.toLocaleString("en-US")} deep: ` +
          `${pyRepr(job.spec.id)} would be deeper (nothing was admitted)`,
      );
    }
  }
  const height = new Map<string, number>();
  for (const job of [...jobs].reverse()) {
    const kids = below.get(job.spec.id) ?? [];
    height.set(job.spec.id, 1 + Math.max(0, ...kids.map((w) => height.get(w) ?? 0)));
  }
  const out: [string, number, number][] = [];
  for (const [d, waiting] of below) {
    if (!ids.has(d)) out.push([d, waiting.length, Math.max(...waiting.map((j) => height.get(j)!))]);
  }
  return out;
}

/** block.lua's refusal as UnknownDependency (or ValueError for a spilled one); any other
 * error as it is. */
export function translate(err: unknown): unknown {
  const text = err instanceof Error ? err.message : String(err);
  if (text.includes("unknown dependency ")) {
    return new UnknownDependency(text.split("unknown dependency ")[1].split(/\s+/)[0]);
  }
  if (text.includes("too many dependents ")) {
    const dep = text.split("too many dependents ")[1].split(/\s+/)[0];
    return new ValueError(
      `at most ${MAX_DEPENDENTS.toLocaleString("en-US")} jobs may wait for one job: ${pyRepr(dep)} ` +
        "has that many already (nothing was admitted)",
    );
  }
  if (text.includes("too deep ")) {
    const dep = text.split("too deep ")[1].split(/\s+/)[0];
    return new ValueError(
      `a chain of blocked jobs may be at most ${MAX_DEPTH.toLocaleString("en-US")} deep: ` +
        `${pyRepr(dep)} sits too deep for it (nothing was admitted)`,
    );
  }
  if (text.includes("spilled dependency ")) {
    const dep = text.split("spilled dependency ")[1].split(/\s+/)[0];
    return new ValueError(
      `dependency ${pyRepr(dep)} is due beyond the spill horizon and held by the floor: a job can ` +
        "wait for it once it is back in Valkey (nothing was admitted)",
    );
  }
  return err;
}

/** The expiry as expire_mark.lua takes it: "-<ms>" from now, or absolute ms for a Date.
 * InvalidSchedule for anything but a finite number of seconds > 0 (at most 100 years) or
 * a valid Date. */
export function expiresArg(expires: unknown): string {
  if (expires instanceof Date) {
    const at = Math.trunc(expires.getTime());
    if (Number.isNaN(at) || !(at > 0 && at <= MAX_DUE_MS)) {
      const shown = Number.isNaN(at) ? "Invalid Date" : expires.toISOString();
      throw new InvalidSchedule(`expires ${shown} is out of range`);
    }
    return String(at);
  }
  if (typeof expires !== "number" || !(Number.isFinite(expires) && expires > 0 && expires <= MAX_DELAY_S)) {
    throw new InvalidSchedule(
      "expires must be a finite number of seconds > 0 (at most 100 years) or an aware datetime, " +
        `got ${pyRepr(expires)}`,
    );
  }
  return String(-Math.max(1, Math.trunc(expires * 1000)));
}

/** Options of one add that do not combine: ValueError, nothing admitted (echomq.admit). */
export function refuseMixed(after: boolean, expires: boolean): void {
  if (after && expires) {
    throw new ValueError(
      "after= and expires= cannot be combined in one add (nothing was admitted); see docs/reference.md",
    );
  }
}
