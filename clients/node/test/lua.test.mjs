// Both languages run the very same scripts: the package's lua/ is byte-identical to the
// Python package's echomq/lua/.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { LUA_DIR } from "../dist/index.js";
import { LuaScript, expand } from "../dist/scripts.js";
import { REPO, runPython } from "./helpers.mjs";

const PYTHON_LUA = join(REPO, "echomq", "lua");

test("the package's Lua scripts are byte-identical to the Python package's", () => {
  const ours = readdirSync(LUA_DIR).filter((f) => f.endsWith(".lua")).sort();
  const theirs = readdirSync(PYTHON_LUA).filter((f) => f.endsWith(".lua")).sort();
  assert.deepEqual(ours, theirs);
  const differ = ours.filter((f) => !readFileSync(join(LUA_DIR, f)).equals(readFileSync(join(PYTHON_LUA, f))));
  assert.deepEqual(differ, [], `scripts differing from echomq/lua (run npm run build): ${differ}`);
});

test("the loader expands --!include as echomq.scripts does: the same text, the same SHA1", () => {
  const names = readdirSync(PYTHON_LUA).filter((f) => f.endsWith(".lua")).map((f) => f.slice(0, -4)).sort();
  const python = JSON.parse(runPython(
    "import json, hashlib, sys; from importlib import resources; from echomq.scripts import expand\n"
      + "print(json.dumps({n: hashlib.sha1(expand(resources.files('echomq').joinpath('lua', n + '.lua')"
      + ".read_text()).encode()).hexdigest() for n in sys.argv[1:]}))",
    names,
  ));
  const ours = Object.fromEntries(names.map((n) => [n, new LuaScript(n, 0).sha]));
  assert.deepEqual(ours, python);
  const including = names.filter((n) => readFileSync(join(LUA_DIR, `${n}.lua`), "utf8").includes("\n--!include "));
  assert.ok(including.includes("cancel") && including.includes("block"), `scripts with includes: ${including}`);
  for (const n of including) assert.ok(!new LuaScript(n, 0).source.includes("\n--!include "), n);
});

test("expand replaces only lines that start with --!include, by the library's whole text", () => {
  const lib = readFileSync(join(LUA_DIR, "deps.lua"), "utf8");
  assert.equal(expand("a\n--!include deps\nb", LUA_DIR), `a\n${lib}\nb`);
  assert.equal(expand("a\n  --!include deps\nb", LUA_DIR), "a\n  --!include deps\nb");
  assert.throws(() => expand("--!include ../x", LUA_DIR), /bad include line/);
});
