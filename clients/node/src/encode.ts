/** Payload encoding as the Python producer does it (docs/protocol.md): compact JSON text,
 * UTF-8, within a size and a nesting depth limit. */
import { PayloadError } from "./errors";

export const MAX_PAYLOAD_BYTES = 512 * 1024;
export const MAX_PAYLOAD_DEPTH = 100;
const ENCODER_DEPTH = 1000; // past this a walk stops, as Python's encoder does

class Refused extends Error {}
class TooDeep extends Error {}

function typeName(value: unknown): string {
  if (value === null || value === undefined) return String(value);
  if (typeof value === "object") return (value as object).constructor?.name ?? "object";
  return typeof value;
}

/** Refuse what JSON cannot carry, as json.dumps(allow_nan=False) does; the deepest level. */
function walk(value: unknown, level: number, seen: Set<object>): number {
  if (level > ENCODER_DEPTH) throw new TooDeep();
  switch (typeof value) {
    case "string":
    case "boolean":
    case "undefined": // JSON.stringify: omitted in objects, null in arrays and alone
      return 0;
    case "number":
      if (!Number.isFinite(value)) throw new Refused("Out of range float values are not JSON compliant");
      return 0;
    case "object":
      break;
    default:
      throw new Refused(`Object of type ${typeName(value)} is not JSON serializable`);
  }
  if (value === null) return 0;
  const proto = Object.getPrototypeOf(value);
  if (!Array.isArray(value) && proto !== Object.prototype && proto !== null) {
    throw new Refused(`Object of type ${typeName(value)} is not JSON serializable`);
  }
  if (seen.has(value)) throw new Refused("Circular reference detected");
  seen.add(value);
  let deepest = 0;
  for (const item of Array.isArray(value) ? value : Object.values(value)) {
    deepest = Math.max(deepest, walk(item, level + 1, seen));
  }
  seen.delete(value);
  return deepest + 1;
}

/** JSON text of `value` (`what` names it in errors) of at most `maxBytes` UTF-8 bytes,
 * nested at most `maxDepth` deep; PayloadError otherwise. */
export function encodeJson(value: unknown, what: string, maxBytes: number, maxDepth: number): string {
  let depth: number;
  try {
    depth = walk(value, 0, new Set());
  } catch (err) {
    if (err instanceof TooDeep) {
      throw new PayloadError(
        `${what} is nested too deep to encode, over the limit of ${maxDepth} levels (maxPayloadDepth)`,
      );
    }
    if (err instanceof Refused) throw new PayloadError(`${what} is not JSON-serialisable: ${err.message}`);
    throw err;
  }
  const text = JSON.stringify(value === undefined ? null : value);
  const bad = firstLoneSurrogate(text);
  if (bad >= 0) {
    throw new PayloadError(`${what} is not valid UTF-8 text: surrogates not allowed at position ${bad}`);
  }
  const size = Buffer.byteLength(text, "utf8");
  if (size > maxBytes) {
    throw new PayloadError(`${what} is ${size} bytes encoded, over the limit of ${maxBytes} bytes (maxPayloadBytes)`);
  }
  if (depth > maxDepth) {
    throw new PayloadError(`${what} is nested ${depth} levels deep, over the limit of ${maxDepth} (maxPayloadDepth)`);
  }
  return text;
}

/** The code point position of a lone surrogate in the JSON text, else -1. JSON.stringify
 * writes one as a \udxxx escape (and no other character so); Python's encoder refuses it. */
function firstLoneSurrogate(text: string): number {
  const m = /(?<!\\)((?:\\\\)*)\\ud[89a-f][0-9a-f]{2}/i.exec(text);
  if (!m) return -1;
  return [...text.slice(0, m.index + m[1].length)].length;
}
