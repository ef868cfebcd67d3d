/** A job's admit arguments, validated by the Python producer's rules (echomq/admit.py). */
import { randomUUID } from "node:crypto";
import { InvalidName, InvalidSchedule, ValueError, pyRepr } from "./errors";
import { encodeJson } from "./encode";
import { DEFAULT_LANE, validateJobId, validateName } from "./keys";

export const MAX_DELAY_S = 100 * 365.25 * 86_400; // 100 years
export const MAX_DUE_MS = 95_617_584_000_000; // 5000-01-01T00:00:00Z
export const ADMIT_BATCH = 500; // jobs per script call

/** Options of one job. Times are in seconds, as in the Python client. */
export interface JobOptions {
  /** The lane (default "default"): lanes of a queue are served round-robin. */
  lane?: string;
  /** Seconds from now before the job may run. */
  delay?: number;
  /** When the job may run (give delay or runAt, not both). */
  runAt?: Date;
  /** Your own id: adding it again admits nothing and returns the same id. */
  jobId?: string;
  /** 0 to 9, higher first. */
  priority?: number;
  /** Executions allowed before the job is dead (default: the queue's, 3). */
  maxAttempts?: number;
  /** The job's own time limit in seconds. */
  timeout?: number;
  /** Ids of jobs of this queue this one waits for (state "blocked" until every one
   * completed); UnknownDependency for an id that does not exist. Not with delay/runAt. */
  after?: Iterable<string>;
  /** "fail" (default): the job dies when a dependency dies or is cancelled; "run": it runs anyway. */
  onDepFailure?: "fail" | "run";
  /** Seconds from now, or a Date: not started by then, the job never runs (state
   * "cancelled", error "expired"). add() only, not with after. */
  expires?: number | Date;
}

export interface Limits {
  maxPayloadBytes: number;
  maxPayloadDepth: number;
  maxAttempts: number;
  maxStalls: number;
}

/** A validated job: its id, admit.lua's 11 values, and schedule.lua's due or null. */
export interface Spec {
  id: string;
  args: string[];
  due: string | null;
}

const OPTIONS = new Set(["lane", "delay", "runAt", "jobId", "priority", "maxAttempts", "timeout"]);

/** Validate one job, in the Python producer's order: name, lane, id, attempts, payload,
 * due time, timeout, priority. */
export function spec(name: unknown, payload: unknown, opts: JobOptions, limits: Limits): Spec {
  const unknown = Object.keys(opts).filter((k) => !OPTIONS.has(k));
  if (unknown.length) throw new ValueError(`unknown job option(s): ${unknown.sort().join(", ")}`);
  if (typeof name !== "string" || name.length === 0 || [...name].length > 255) {
    throw new InvalidName(`invalid job name ${pyRepr(name)}: a non-empty string of at most 255 chars`);
  }
  const lane = opts.lane !== undefined && opts.lane !== null ? validateName(opts.lane, "lane name") : DEFAULT_LANE;
  const id = opts.jobId !== undefined && opts.jobId !== null ? validateJobId(opts.jobId) : randomUUID().replace(/-/g, "");
  const attempts = opts.maxAttempts ?? limits.maxAttempts;
  if (!Number.isInteger(attempts) || attempts < 1) {
    throw new ValueError(`max_attempts must be an integer >= 1, got ${pyRepr(opts.maxAttempts)}`);
  }
  const encoded = encodeJson(payload, "payload", limits.maxPayloadBytes, limits.maxPayloadDepth);
  const due = dueArg(opts.delay, opts.runAt);
  const args = [
    id, name, encoded, lane, String(attempts), String(limits.maxStalls), "",
    timeoutMs(opts.timeout), "", "", priorityArg(opts.priority === undefined ? 0 : opts.priority),
  ];
  return { id, args, due };
}

/** schedule.lua's due argument: "-<ms>" from now, absolute ms, or null for now. */
export function dueArg(delay: unknown, runAt: unknown): string | null {
  if (delay !== undefined && delay !== null && runAt !== undefined && runAt !== null) {
    throw new InvalidSchedule("give delay or run_at, not both");
  }
  if (runAt !== undefined && runAt !== null) {
    if (!(runAt instanceof Date) || Number.isNaN(runAt.getTime())) {
      throw new InvalidSchedule(`run_at must be a datetime, got ${pyRepr(runAt)}`);
    }
    const at = Math.max(0, Math.trunc(runAt.getTime()));
    if (at > MAX_DUE_MS) {
      throw new InvalidSchedule(`run_at ${runAt.toISOString()} is too far in the future (the limit is the year 5000)`);
    }
    return String(at);
  }
  if (delay === undefined || delay === null) return null;
  if (typeof delay !== "number" || Number.isNaN(delay)) {
    throw new InvalidSchedule(`delay must be a number of seconds, got ${pyRepr(delay)}`);
  }
  if (delay < 0 || !Number.isFinite(delay)) {
    throw new InvalidSchedule(`delay must be a finite number of seconds >= 0, got ${pyRepr(delay)}`);
  }
  if (delay > MAX_DELAY_S) {
    throw new InvalidSchedule(`delay ${pyRepr(delay)} s is too far in the future (at most ${MAX_DELAY_S.toFixed(0)} s, 100 years)`);
  }
  const ms = Math.trunc(delay * 1000);
  return ms === 0 ? null : String(-ms);
}

/** A job's priority as the scripts take it: "0" to "9". */
export function priorityArg(priority: unknown): string {
  if (typeof priority !== "number" || !Number.isInteger(priority) || priority < 0 || priority > 9) {
    throw new ValueError(`priority must be an integer from 0 to 9, got ${pyRepr(priority)}`);
  }
  return String(priority);
}

/** A job's time limit as the scripts store it: whole ms, "" for none. */
export function timeoutMs(timeout: unknown): string {
  if (timeout === undefined || timeout === null) return "";
  if (typeof timeout !== "number" || !Number.isFinite(timeout) || timeout <= 0) {
    throw new ValueError(`timeout must be a finite number of seconds > 0, got ${pyRepr(timeout)}`);
  }
  return String(Math.max(1, Math.ceil(timeout * 1000)));
}
