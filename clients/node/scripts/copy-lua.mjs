// Copies the Python package's Lua scripts into this package (lua/), byte for byte:
// both languages run the very same files, so they share their SHA1s.
import { copyFileSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const source = resolve(here, "..", "..", "..", "echomq", "lua");
const target = resolve(here, "..", "lua");
rmSync(target, { recursive: true, force: true });
mkdirSync(target, { recursive: true });
const files = readdirSync(source).filter((f) => f.endsWith(".lua"));
if (files.length === 0) throw new Error(`no .lua files in ${source}`);
for (const f of files) copyFileSync(join(source, f), join(target, f));
console.log(`copied ${files.length} scripts from ${source}`);
