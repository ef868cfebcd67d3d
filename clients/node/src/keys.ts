/** The keyspace of one queue: every key starts with `emq:{<queue>}:` (docs/protocol.md). */
import { InvalidName, pyRepr } from "./errors";

const NAME = /^[A-Za-z0-9._:-]{1,128}$/;
const JOB_ID = /^[A-Za-z0-9._:-]{1,255}$/;
export const DEFAULT_LANE = "default";
/** Every queue's name, for `echomq queues` (outside any queue's slot). */
export const REGISTRY = "emq:queues";

/** Return `name` if it is a valid queue or lane name, else throw InvalidName. */
export function validateName(name: unknown, what = "queue name"): string {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new InvalidName(
      `invalid ${what} ${pyRepr(name)}: use 1-128 characters from [A-Za-z0-9._:-]` +
        " (braces, spaces and other characters are not allowed)",
    );
  }
  return name;
}

/** Return `jobId` if it is a valid caller-given job id, else throw InvalidName. */
export function validateJobId(jobId: unknown): string {
  if (typeof jobId !== "string" || !JOB_ID.test(jobId)) {
    throw new InvalidName(`invalid job id ${pyRepr(jobId)}: use 1-255 characters from [A-Za-z0-9._:-]`);
  }
  return jobId;
}

/** Key names of one queue. */
export class Keys {
  readonly prefix: string;
  constructor(readonly queue: string) {
    validateName(queue);
    this.prefix = `emq:{${queue}}:`;
  }
  key(name: string): string {
    return this.prefix + name;
  }
  job(id: string): string {
    return `${this.prefix}job:${id}`;
  }
  done(id: string): string {
    return `${this.prefix}done:${id}`;
  }
  get meta(): string {
    return this.key("meta");
  }
  /** KEYS of admit.lua, in its header's order. */
  admit(): string[] {
    return ["ring", "wake", "spilled", "stats", "paused", "prios", "events"].map((k) => this.key(k));
  }
  /** KEYS of schedule.lua. */
  schedule(): string[] {
    return ["schedule", "wake", "meta", "fold", "spilled", "events"].map((k) => this.key(k));
  }
  /** KEYS of counts.lua. */
  counts(): string[] {
    return ["ring", "schedule", "leases", "dead", "stats", "spilled", "cancelled", "paused", "prios", "blocked"].map(
      (k) => this.key(k),
    );
  }
  /** KEYS of cancel.lua. */
  cancel(): string[] {
    return ["schedule", "ring", "cancelled", "meta", "closed", "stats", "spilled", "blocked", "events"].map(
      (k) => this.key(k),
    );
  }
  /** KEYS of block.lua (jobs with dependencies). */
  block(): string[] {
    return [this.key("waitdeps"), this.key("events")];
  }
  /** KEYS of expire_mark.lua (a job's expiry). */
  expireMark(): string[] {
    return [this.key("expiring")];
  }
}
