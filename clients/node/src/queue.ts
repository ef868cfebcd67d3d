/** The producer: admit jobs, read them, count them, wait for results, cancel. */
import { createHash } from "node:crypto";
import Redis from "ioredis";
import { ADMIT_BATCH, JobOptions, Limits, Spec, spec } from "./admit";
import { Blocked, OnDepFailure, blockArgs, blocked, dependencies, expiresArg, refuseMixed, translate } from "./depend";
import { JobFailed, JobNotFound, TimeoutError, ValueError, pyRepr } from "./errors";
import { MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH } from "./encode";
import { Keys, REGISTRY, validateJobId, validateName } from "./keys";
import { PROTOCOL_FIELD, PROTOCOL_VERSION, checkProtocol } from "./protocol";
import { LuaScript, scripts } from "./scripts";

const ADMIT_CALL_BYTES = 8 * 1024 * 1024; // payload bytes per script call in addMany
const SERVER_GRACE_S = 1; // the server's own BLMOVE timeout, past the client's deadline
const SLICE_S = 300; // result() without a timeout parks in slices this long
const STATES = ["waiting", "scheduled", "active", "completed", "dead", "cancelled"] as const;

export interface QueueOptions {
  /** Valkey/Redis URL (default: ECHOMQ_REDIS_URL, else redis://127.0.0.1:6379/0). */
  url?: string;
  /** An ioredis client to use instead of a URL (not closed by close()). */
  connection?: Redis;
  maxPayloadBytes?: number;
  maxPayloadDepth?: number;
  /** Default executions allowed per job (3). */
  maxAttempts?: number;
  /** Lease expiries allowed per job before it is dead (1). */
  maxStalls?: number;
}

/** A job to admit with addMany: add()'s arguments in one object. */
export interface JobSpec extends JobOptions {
  name: string;
  payload?: unknown;
}

/** One job as its hash holds it (times in server ms, timeout in seconds). */
export interface Job {
  id: string;
  name: string;
  payload: unknown;
  lane: string;
  state: string;
  attempts: number;
  maxAttempts: number;
  stalls: number;
  error: string | null;
  result: unknown;
  progress: unknown;
  priority: number;
  timeout: number | null;
  createdMs: number;
  dueMs: number | null;
  startedMs: number | null;
  finishedMs: number | null;
}

export type Counts = Record<(typeof STATES)[number], number>;

/** A named queue on a Valkey/Redis server, as echomq.Queue in Python. */
export class Queue {
  readonly name: string;
  readonly keys: Keys;
  readonly redis: Redis;
  private readonly owned: boolean;
  private readonly limits: Limits;
  private registered: Promise<void> | null = null;
  private checked: Promise<void> | null = null;
  private readonly idleWaiters: Redis[] = [];
  private readonly busyWaiters = new Set<Redis>();

  constructor(name: string, options: QueueOptions = {}) {
    this.name = validateName(name);
    this.keys = new Keys(name);
    this.limits = {
      maxPayloadBytes: options.maxPayloadBytes ?? MAX_PAYLOAD_BYTES,
      maxPayloadDepth: options.maxPayloadDepth ?? MAX_PAYLOAD_DEPTH,
      maxAttempts: options.maxAttempts ?? 3,
      maxStalls: options.maxStalls ?? 1,
    };
    if (options.connection) {
      this.redis = options.connection;
      this.owned = false;
    } else {
      this.redis = new Redis(options.url ?? process.env.ECHOMQ_REDIS_URL ?? "redis://127.0.0.1:6379/0");
      this.owned = true;
    }
  }

  /** Admit one job and return its id (the same id again for a repeated jobId). */
  async add(name: string, payload?: unknown, options: JobOptions = {}): Promise<string> {
    const { after, onDepFailure, expires, ...rest } = options;
    const fail = onDepFailure ?? "fail";
    const waits = (after !== undefined && after !== null) || fail !== "fail";
    refuseMixed(waits, expires !== undefined && expires !== null);
    const until = expires === undefined || expires === null ? null : expiresArg(expires);
    const s = spec(name, payload, rest, this.limits);
    const deps = waits ? dependencies(after ?? [], fail) : null;
    if (deps !== null) {
      await this.addBlocked([s], [{ after: deps, fail: fail as OnDepFailure }]);
      return s.id;
    }
    await this.register();
    if (until !== null) await this.admitExpiring(s, until);
    else await this.admit([s]);
    return s.id;
  }

  /** Admit many jobs; every one is validated before anything is sent, so a bad one admits
   * none. A job may take `after`/`onDepFailure`, or `expires` (marked in the admit's
   * transaction), not both kinds in one call, as in Python. */
  async addMany(jobs: Iterable<JobSpec>): Promise<string[]> {
    const items: [unknown, unknown, JobOptions][] = [];
    const deps: ({ after: string[]; fail: OnDepFailure } | null)[] = [];
    const untils: (string | null)[] = [];
    for (const job of jobs) {
      if (job === null || typeof job !== "object") {
        throw new ValueError(`a job is {name, payload, ...options}, got ${pyRepr(job)}`);
      }
      const { name, payload, after, onDepFailure, expires, ...options } = job;
      if (after !== undefined || onDepFailure !== undefined) {
        const fail = onDepFailure ?? "fail";
        deps.push({ after: dependencies(after === undefined ? [] : after, fail), fail: fail as OnDepFailure });
      } else {
        deps.push(null);
      }
      items.push([name, payload, { ...options, expires }]);
    }
    // job by job, each expiry before its spec, the call's mix after: Python's order
    const specs = items.map(([name, payload, { expires, ...options }]) => {
      untils.push(expires === undefined || expires === null ? null : expiresArg(expires));
      return spec(name, payload, options, this.limits);
    });
    const blocked = deps.some((d) => d !== null);
    refuseMixed(blocked, untils.some((u) => u !== null));
    if (!specs.length) return [];
    if (blocked) {
      await this.addBlocked(specs, deps);
    } else {
      await this.register();
      if (untils.some((u) => u !== null)) {
        // a transaction per ADMIT_BATCH jobs, each their admit and their marks
        for (let start = 0; start < specs.length; start += ADMIT_BATCH) {
          const group = specs.slice(start, start + ADMIT_BATCH);
          const marks = group.flatMap((s, i) => {
            const until = untils[start + i];
            return until === null ? [] : [this.markCall(s, until)];
          });
          await this.runAtomically([...this.plainCalls(group), ...marks]);
        }
      } else {
        await this.admit(specs);
      }
    }
    return specs.map((s) => s.id);
  }

  /** The expire_mark.lua call of a job just admitted; with the SHA1 of its payload, so
   * another job under the same id (left alone by the admit) is not marked. */
  private markCall(s: Spec, until: string): Call {
    const digest = createHash("sha1").update(s.args[2], "utf8").digest("hex");
    return [scripts().expireMark, this.keys.expireMark(), [this.keys.prefix, s.id, until, digest]];
  }

  /** The job with this id, or null. */
  async get(jobId: string): Promise<Job | null> {
    validateJobId(jobId);
    await this.checkProtocol();
    const h = await this.redis.hgetall(this.keys.job(jobId));
    return Object.keys(h).length ? toJob(h) : null;
  }

  /** Jobs per state (completed: a running total). */
  async counts(): Promise<Counts> {
    await this.checkProtocol();
    const v = (await scripts().counts.call(this.redis, this.keys.counts(), [this.keys.prefix, ""])) as number[];
    const values = [...v.slice(0, 5), v[8]].map(Number);
    return Object.fromEntries(STATES.map((s, i) => [s, values[i]])) as Counts;
  }

  /** Cancel a waiting or scheduled job; false when it is active, finished or unknown. */
  async cancel(jobId: string): Promise<boolean> {
    validateJobId(jobId);
    await this.register();
    const code = await scripts().cancel.call(this.redis, this.keys.cancel(), [this.keys.prefix, jobId]);
    return Number(code) === 1;
  }

  /**
   * Wait for the job to finish and give back its result. Parks on the job's doorbell
   * (await.lua, then BLMOVE done:<id>), never polls. Throws JobFailed for a dead or
   * cancelled job, JobNotFound for an unknown id, TimeoutError after `timeout` seconds.
   */
  async result(jobId: string, options: { timeout?: number } = {}): Promise<unknown> {
    validateJobId(jobId);
    const timeout = options.timeout;
    if (timeout !== undefined && (typeof timeout !== "number" || Number.isNaN(timeout))) {
      throw new ValueError(`timeout must be a number of seconds or None, got ${pyRepr(timeout)}`);
    }
    await this.checkProtocol();
    const deadline = timeout === undefined ? null : Date.now() + Math.max(0, timeout) * 1000;
    const conn = this.idleWaiters.pop() ?? this.redis.duplicate();
    this.busyWaiters.add(conn);
    let clean = false;
    try {
      const keys = [this.keys.job(jobId), this.keys.done(jobId)];
      for (;;) {
        const mark = deadline === null || deadline > Date.now();
        const outcome = this.outcome(jobId, await scripts().await.call(conn, keys, [mark ? "1" : "0"]));
        if (outcome !== PENDING) {
          clean = true;
          return outcome;
        }
        const remaining = deadline === null ? null : (deadline - Date.now()) / 1000;
        if (remaining !== null && remaining <= 0) {
          clean = true;
          throw new TimeoutError(`job ${pyRepr(jobId)} did not finish within ${timeout} s`);
        }
        if (!(await park(conn, keys[1], remaining))) {
          // the socket was dropped at the deadline: one last read on the command connection
          const last = this.outcome(jobId, await scripts().await.call(this.redis, keys, ["0"]));
          if (last !== PENDING) return last;
          throw new TimeoutError(`job ${pyRepr(jobId)} did not finish within ${timeout} s`);
        }
      }
    } catch (err) {
      if (err instanceof JobFailed || err instanceof JobNotFound) clean = true;
      throw err;
    } finally {
      this.busyWaiters.delete(conn);
      if (clean && conn.status === "ready") this.idleWaiters.push(conn);
      else conn.disconnect();
    }
  }

  /** Close the connections this queue opened. */
  async close(): Promise<void> {
    for (const c of [...this.idleWaiters, ...this.busyWaiters]) c.disconnect();
    this.idleWaiters.length = 0;
    this.busyWaiters.clear();
    if (this.owned) await this.redis.quit().catch(() => this.redis.disconnect());
  }

  private outcome(jobId: string, reply: unknown): unknown {
    const f = (reply as (string | null)[]).map((x) => (x === null ? "" : String(x)));
    switch (f[0]) {
      case "pending":
        return PENDING;
      case "completed":
        return decodeResult(f[1]);
      case "dead":
        throw new JobFailed(jobId, f[2]);
      case "cancelled":
        throw new JobFailed(jobId, f[2] || "the job was cancelled");
      case "missing":
        if (f[1] === "c") return null;
        if (f[1] === "d") throw new JobFailed(jobId, "(the dead job's record is gone)");
        throw new JobNotFound(`no job ${pyRepr(jobId)} (never admitted, or dropped by retention)`);
      default:
        throw new Error(`await.lua answered ${JSON.stringify(reply)}`);
    }
  }

  /** At first write: record this client's protocol version when none is, check the
   * recorded one (ProtocolMismatch before anything else is sent), list the queue. */
  private register(): Promise<void> {
    if (!this.registered) {
      this.registered = (async () => {
        await this.redis.hsetnx(this.keys.meta, PROTOCOL_FIELD, PROTOCOL_VERSION);
        checkProtocol(this.name, await this.redis.hget(this.keys.meta, PROTOCOL_FIELD));
        await this.redis.sadd(REGISTRY, this.name);
      })();
      this.registered.catch(() => (this.registered = null));
      this.checked = this.registered;
    }
    return this.registered;
  }

  /** At first read: check the recorded protocol version (reads record nothing). */
  private checkProtocol(): Promise<void> {
    if (!this.checked) {
      this.checked = this.redis.hget(this.keys.meta, PROTOCOL_FIELD).then((v) => checkProtocol(this.name, v));
      this.checked.catch(() => (this.checked = null));
    }
    return this.checked;
  }

  /** admit.lua for jobs due now, schedule.lua for deferred ones, in chunks. */
  private async admit(specs: Spec[]): Promise<void> {
    await Promise.all(this.plainCalls(specs).map(([script, keys, args]) => script.call(this.redis, keys, args)));
  }

  /** The admit.lua and schedule.lua calls of validated jobs without dependencies. */
  private plainCalls(specs: Spec[]): Call[] {
    const calls: Call[] = [];
    for (const chunk of chunks(specs.filter((s) => s.due === null))) {
      const args = [this.keys.prefix, String(chunk.length), ...chunk.flatMap((s) => s.args)];
      calls.push([scripts().admit, this.keys.admit(), args]);
    }
    for (const chunk of chunks(specs.filter((s) => s.due !== null))) {
      const args = [this.keys.prefix, String(chunk.length), ...chunk.flatMap((s) => [...s.args, s.due as string])];
      calls.push([scripts().schedule, this.keys.schedule(), args]);
    }
    return calls;
  }

  /** One job and its expiry (expire_mark.lua) in one MULTI/EXEC, so no claim runs between
   * the two. */
  private async admitExpiring(s: Spec, until: string): Promise<void> {
    await this.runAtomically([...this.plainCalls([s]), this.markCall(s, until)]);
  }

  /** Script calls of this queue in one MULTI/EXEC: no other client's command runs between
   * them. A script the server lacks is loaded and the transaction runs again (the calls
   * are idempotent), as echomq.scripts.execute_atomically does. A call's error is thrown. */
  private async runAtomically(calls: Call[]): Promise<void> {
    // a script the server lacks fails its calls at EXEC while the others run: calls of more
    // than one script load each inside the transaction first (a partial run is not undone)
    const distinct = [...new Map(calls.map(([script]) => [script.sha, script])).values()];
    const preload = distinct.length > 1 ? distinct : [];
    for (let attempt = 0; ; attempt++) {
      const tx = this.redis.multi();
      for (const script of preload) tx.script("LOAD", script.source);
      for (const [script, keys, args] of calls) tx.evalsha(script.sha, keys.length, ...keys, ...args);
      const all = await tx.exec();
      if (all === null) throw new Error("EXEC aborted");
      const replies = all.slice(preload.length);
      const missing = calls.filter((_, i) => String(replies[i]?.[0]?.message ?? "").startsWith("NOSCRIPT"));
      if (!missing.length || attempt > 0) {
        for (const [err] of replies) if (err) throw err;
        return;
      }
      for (const [script] of missing) await this.redis.script("LOAD", script.source);
    }
  }

  /** Jobs some of which have dependencies (`deps`, null for one without), in order:
   * deferred jobs without any by schedule.lua, then the rest, in order, by
   * block.lua (echomq.depend.plan). UnknownDependency: block.lua wrote nothing. */
  private async addBlocked(specs: Spec[], deps: ({ after: string[]; fail: OnDepFailure } | null)[]): Promise<void> {
    const deferred = specs.filter((s, i) => deps[i] === null && s.due !== null);
    const rest: Blocked[] = [];
    specs.forEach((s, i) => {
      const d = deps[i];
      if (d !== null || s.due === null) rest.push(blocked(s, d ? d.after : [], d ? d.fail : "fail"));
    });
    await this.register();
    const calls: Call[] = [
      ...this.plainCalls(deferred),
      ...blockArgs(this.keys.prefix, rest).map((args): Call => [scripts().block, this.keys.block(), args]),
    ];
    // more than one call: in one MULTI/EXEC, whole before any of its jobs can run and end
    // (retention would drop a member's result before the job fed it is admitted)
    try {
      if (calls.length === 1) await calls[0][0].call(this.redis, calls[0][1], calls[0][2]);
      else await this.runAtomically(calls);
    } catch (err) {
      throw translate(err);
    }
  }
}

const PENDING = Symbol("pending");

type Call = [LuaScript, string[], string[]];

/** Script calls of at most ADMIT_BATCH jobs and ADMIT_CALL_BYTES of payload. */
function chunks(specs: Spec[]): Spec[][] {
  const out: Spec[][] = [];
  let cur: Spec[] = [];
  let size = 0;
  for (const s of specs) {
    const n = Buffer.byteLength(s.args[2], "utf8");
    if (cur.length && (cur.length >= ADMIT_BATCH || size + n > ADMIT_CALL_BYTES)) {
      out.push(cur);
      cur = [];
      size = 0;
    }
    cur.push(s);
    size += n;
  }
  if (cur.length) out.push(cur);
  return out;
}

/** One BLMOVE on the doorbell; true when a token came, false at the deadline (the
 * connection is dropped then: the server forgets the parked call with it). */
async function park(conn: Redis, key: string, remaining: number | null): Promise<boolean> {
  const server = remaining === null ? SLICE_S : remaining + SERVER_GRACE_S;
  const call = conn.call("BLMOVE", key, key, "LEFT", "LEFT", server.toFixed(3));
  if (remaining === null) return (await call) !== null;
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<"expired">((resolve) => {
    timer = setTimeout(() => resolve("expired"), Math.max(0, remaining * 1000));
  });
  try {
    const reply = await Promise.race([call, expired]);
    if (reply === "expired") {
      call.catch(() => undefined);
      conn.disconnect();
      return false;
    }
    return reply !== null;
  } finally {
    clearTimeout(timer);
  }
}

/** A stored result as the handler returned it (JSON), or the raw text if not JSON. */
function decodeResult(text: string): unknown {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function num(v: string | undefined): number | null {
  if (v === undefined || v === "") return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : null;
}

function toJob(h: Record<string, string>): Job {
  const timeoutMs = num(h.timeout_ms);
  return {
    id: h.id,
    name: h.name,
    payload: h.payload === undefined ? null : decodeResult(h.payload),
    lane: h.lane,
    state: h.state,
    attempts: num(h.attempts) ?? 0,
    maxAttempts: num(h.max_attempts) ?? 1,
    stalls: num(h.stalls) ?? 0,
    error: h.error ?? null,
    result: h.result === undefined ? null : decodeResult(h.result),
    progress: h.progress === undefined ? null : decodeResult(h.progress),
    priority: num(h.priority) ?? 0,
    timeout: timeoutMs === null ? null : timeoutMs / 1000,
    createdMs: num(h.created_ms) ?? 0,
    dueMs: num(h.due_ms),
    startedMs: num(h.started_ms),
    finishedMs: num(h.finished_ms),
  };
}
