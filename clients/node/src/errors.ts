/**
 * Errors raised by the EchoMQ client. Each class has the name of the Python exception
 * raised for the same input (echomq.errors), so both clients fail alike.
 */

/** Base class of every EchoMQ error. */
export class EchoMQError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A queue, lane or job name, or a job id, breaks the naming rules. */
export class InvalidName extends EchoMQError {}

/** A payload is not JSON-serialisable, or exceeds the size or depth limit. */
export class PayloadError extends EchoMQError {}

/** A delay or runAt is not a valid time. */
export class InvalidSchedule extends EchoMQError {}

/** An option has a bad value (priority, maxAttempts, timeout...); Python raises ValueError. */
export class ValueError extends EchoMQError {}

/** The queue's meta records a wire protocol of another MAJOR version; nothing was admitted. */
export class ProtocolMismatch extends EchoMQError {}

/** `result()` found the job dead or cancelled; `error` holds its last error text. */
export class JobFailed extends EchoMQError {
  constructor(
    readonly jobId: string,
    readonly error: string,
  ) {
    super(`job ${pyRepr(jobId)} is dead: ${lastLine(error)}`);
  }
}

/** No job with this id exists (never admitted, or dropped by retention). */
export class JobNotFound extends EchoMQError {}

/** `result()` waited `timeout` seconds and the job did not finish. */
export class TimeoutError extends EchoMQError {}

function lastLine(text: string): string {
  const lines = text.trim().split("\n").filter((l) => l.trim());
  return lines.length ? lines[lines.length - 1] : "(no error text)";
}

/** A value as Python's repr() writes it, so messages read the same in both clients. */
export function pyRepr(value: unknown): string {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") {
    if (Number.isNaN(value)) return "nan";
    if (value === Infinity) return "inf";
    if (value === -Infinity) return "-inf";
    return String(value);
  }
  if (typeof value === "string") {
    const quote = value.includes("'") && !value.includes('"') ? '"' : "'";
    let out = "";
    for (const ch of value) {
      const code = ch.codePointAt(0)!;
      if (ch === "\\") out += "\\\\";
      else if (ch === quote) out += "\\" + ch;
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (ch === "\t") out += "\\t";
      else if (code < 0x20 || code === 0x7f) out += "\\x" + code.toString(16).padStart(2, "0");
      else if (code >= 0xd800 && code <= 0xdfff) out += "\\u" + code.toString(16);
      else out += ch;
    }
    return quote + out + quote;
  }
  if (Array.isArray(value)) return "[" + value.map(pyRepr).join(", ") + "]";
  if (typeof value === "object") {
    const proto = Object.getPrototypeOf(value);
    if (proto === Object.prototype || proto === null) {
      return "{" + Object.entries(value as object).map(([k, v]) => `${pyRepr(k)}: ${pyRepr(v)}`).join(", ") + "}";
    }
    return `<${(value as object).constructor?.name ?? "object"}>`;
  }
  return String(value);
}

/** A job named a dependency (`after`) that does not exist; nothing was admitted. */
export class UnknownDependency extends EchoMQError {
  constructor(readonly jobId: string) {
    super(`unknown dependency ${pyRepr(jobId)}: no such job in this queue (nothing was admitted)`);
  }
}
