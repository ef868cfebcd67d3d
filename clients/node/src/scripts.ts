/** The Lua scripts, read from this package's lua/ (a byte-identical copy of the Python
 * package's echomq/lua/), expanded as echomq/scripts.py expands them, called by SHA1 and
 * loaded again on NOSCRIPT. */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type Redis from "ioredis";

export const LUA_DIR = join(__dirname, "..", "lua");

const INCLUDE = "--!include ";

/**
 * A script's text with each line `--!include NAME` replaced by lua/NAME.lua (a library of
 * local functions, e.g. deps.lua), exactly as echomq.scripts.expand does: the same text,
 * so the same SHA1 in both languages. A library is never run alone.
 */
export function expand(source: string, dir: string = LUA_DIR): string {
  return source
    .split("\n")
    .map((line) => {
      if (!line.startsWith(INCLUDE)) return line;
      const lib = line.trim().split(/\s+/)[1];
      if (!lib || !/^[A-Za-z0-9_]+$/.test(lib)) throw new Error(`bad include line ${JSON.stringify(line)}`);
      return readFileSync(join(dir, `${lib}.lua`), "utf8");
    })
    .join("\n");
}

export class LuaScript {
  readonly source: string;
  readonly sha: string;
  constructor(
    readonly name: string,
    readonly numKeys: number,
  ) {
    this.source = expand(readFileSync(join(LUA_DIR, `${name}.lua`), "utf8"));
    this.sha = createHash("sha1").update(this.source, "utf8").digest("hex");
  }

  /** EVALSHA; on NOSCRIPT, SCRIPT LOAD and once more. */
  async call(client: Redis, keys: string[], args: (string | number)[]): Promise<unknown> {
    if (keys.length !== this.numKeys) {
      throw new Error(`${this.name}.lua takes ${this.numKeys} keys, got ${keys.length}`);
    }
    try {
      return await client.evalsha(this.sha, this.numKeys, ...keys, ...args);
    } catch (err) {
      if (!(err instanceof Error) || !err.message.startsWith("NOSCRIPT")) throw err;
      await client.script("LOAD", this.source);
      return await client.evalsha(this.sha, this.numKeys, ...keys, ...args);
    }
  }
}

export interface Scripts {
  admit: LuaScript;
  schedule: LuaScript;
  block: LuaScript;
  expireMark: LuaScript;
  await: LuaScript;
  counts: LuaScript;
  cancel: LuaScript;
}

let loaded: Scripts | null = null;

/** The scripts this producer calls, read once. */
export function scripts(): Scripts {
  if (!loaded) {
    loaded = {
      admit: new LuaScript("admit", 7),
      schedule: new LuaScript("schedule", 6),
      block: new LuaScript("block", 2),
      expireMark: new LuaScript("expire_mark", 1),
      await: new LuaScript("await", 2),
      counts: new LuaScript("counts", 10),
      cancel: new LuaScript("cancel", 9),
    };
  }
  return loaded;
}
