// Test harness: the real sidecar ($POLYGW_BUILD/polygw, default build/) and
// the real mock upstream ($POLYGW_BUILD/mock_upstream), each in a fresh temp
// directory; both must exit 0 on SIGTERM and print no sanitizer report.
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, "..", "..", "..");
export const BUILD = process.env.POLYGW_BUILD || path.join(ROOT, "build");
export const VECTORS = path.join(ROOT, "proto", "vectors");
const SANITIZER_MARKERS = ["ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"];

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function sanitizerEnv(extra = {}) {
  return {
    ...process.env,
    ASAN_OPTIONS: process.env.ASAN_OPTIONS || "detect_leaks=1",
    UBSAN_OPTIONS: process.env.UBSAN_OPTIONS || "print_stacktrace=1:halt_on_error=1",
    no_proxy: "*",
    NO_PROXY: "*",
    ...extra,
  };
}

function waitExit(proc, ms) {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve(proc.exitCode);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`process ${proc.pid} did not exit within ${ms} ms`));
    }, ms);
    proc.once("exit", (code, signal) => {
      clearTimeout(timer);
      resolve(code ?? signal);
    });
  });
}

/** The scriptable mock upstream (tests/mock_upstream/README.md). */
export class Mock {
  static async start() {
    const m = new Mock();
    m.stderr = "";
    m.proc = spawn(path.join(BUILD, "mock_upstream"), ["--port", "0", "--host", "127.0.0.1"],
      { stdio: ["ignore", "pipe", "pipe"], env: sanitizerEnv() });
    m.proc.stderr.on("data", (d) => { m.stderr += d; });
    m.port = await new Promise((resolve, reject) => {
      let out = "";
      const timer = setTimeout(() => reject(new Error("mock upstream did not start")), 10000);
      m.proc.stdout.on("data", (d) => {
        out += d;
        const match = /^LISTENING (\d+)\n/.exec(out);
        if (match) {
          clearTimeout(timer);
          resolve(Number(match[1]));
        }
      });
      m.proc.once("exit", (code) => reject(new Error(`mock upstream exited (${code}): ${m.stderr}`)));
    });
    return m;
  }

  get url() {
    return `http://127.0.0.1:${this.port}/v1`;
  }

  control(method, p, body) {
    const data = body === undefined ? null : Buffer.from(JSON.stringify(body));
    return new Promise((resolve, reject) => {
      const req = http.request({
        host: "127.0.0.1", port: this.port, method, path: p, agent: false,
        headers: { Connection: "close", ...(data ? { "Content-Type": "application/json" } : {}) },
        timeout: 5000,
      }, (res) => {
        let text = "";
        res.on("data", (d) => { text += d; });
        res.on("end", () => {
          if (res.statusCode !== 200) reject(new Error(`mock ${method} ${p}: ${res.statusCode} ${text}`));
          else resolve(text ? JSON.parse(text) : null);
        });
      });
      req.on("error", reject);
      req.on("timeout", () => req.destroy(new Error("mock control timeout")));
      req.end(data);
    });
  }

  stats() {
    return this.control("GET", "/_mock/stats");
  }

  last() {
    return this.control("GET", "/_mock/last");
  }

  /** Polls stats until pred(stats); resolves to them, rejects after `timeoutMs`. */
  async waitStats(pred, timeoutMs = 2000, intervalMs = 2) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const st = await this.stats();
      if (pred(st)) return st;
      if (Date.now() >= deadline) throw new Error(`mock stats condition not met: ${JSON.stringify(st)}`);
      await sleep(intervalMs);
    }
  }

  async stop() {
    this.proc.kill("SIGTERM");
    const code = await waitExit(this.proc, 10000);
    if (code !== 0) throw new Error(`mock upstream exited with ${code}: ${this.stderr}`);
  }
}

const SOURCE = {
  timeout_s: 20, connect_timeout_s: 5, ttft_timeout_s: 20, idle_timeout_s: 20, max_concurrency: 64,
  aimd: { initial: 64 }, breaker: { failures: 100000 },
};
const DEFAULTS = { max_attempts: 1, stall_window_s: 20, backoff_base_s: 0.05, backoff_max_s: 0.1, poll_interval_s: 0.05 };

const yaml = (v) => (typeof v === "object" && v !== null
  ? `{${Object.entries(v).map(([k, x]) => `${k}: ${yaml(x)}`).join(", ")}}`
  : typeof v === "string" ? JSON.stringify(v) : String(v));

/** A sidecar config whose one chat source "a" is the mock. */
export function configText(upUrl, { defaults = {}, source = {}, grace = 0.5, backend } = {}) {
  const lines = ["listen:", '  mode: "0660"', "server:", "  log_level: info", `  shutdown_grace_s: ${grace}`];
  if (backend) lines.push(`backend: ${yaml(backend)}`);
  lines.push("defaults:");
  for (const [k, v] of Object.entries({ ...DEFAULTS, ...defaults })) lines.push(`  ${k}: ${yaml(v)}`);
  lines.push("sources:", "  - name: a", "    capability: chat", `    base_url: ${upUrl}`);
  for (const [k, v] of Object.entries({ ...SOURCE, ...source })) lines.push(`    ${k}: ${yaml(v)}`);
  return `${lines.join("\n")}\n`;
}

/** One polygw process with its own temp dir, config, socket and log. */
export class Sidecar {
  constructor(config, args = []) {
    this.args = args; // more command-line arguments
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "pgwjs")); // short: socket paths max 107 bytes
    this.sock = path.join(this.dir, "polygw.sock");
    this.configPath = path.join(this.dir, "polygw.yaml");
    this.logPath = path.join(this.dir, "polygw.log");
    fs.writeFileSync(this.configPath, config);
    this.proc = null;
  }

  static async start(config, args) {
    const sc = new Sidecar(config, args);
    await sc.start();
    return sc;
  }

  async start() {
    const log = fs.openSync(this.logPath, "a");
    this.proc = spawn(path.join(BUILD, "polygw"), ["--config", this.configPath, "--socket", this.sock, ...this.args],
      { stdio: ["ignore", log, log], env: sanitizerEnv() });
    fs.closeSync(log);
    const deadline = Date.now() + 10000;
    for (;;) {
      if (this.proc.exitCode !== null) throw new Error(`polygw exited early:\n${this.logs()}`);
      if (await canConnect(this.sock)) return;
      if (Date.now() > deadline) throw new Error(`polygw did not start listening:\n${this.logs()}`);
      await sleep(20);
    }
  }

  logs() {
    try {
      return fs.readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }

  /** SIGTERM; resolves to the exit code. */
  async stop() {
    if (!this.proc || this.proc.exitCode !== null) return this.proc?.exitCode;
    this.proc.kill("SIGTERM");
    return waitExit(this.proc, 15000);
  }

  /** Stops and checks: exit 0, no sanitizer report; removes the temp dir. */
  async finish() {
    const code = await this.stop();
    const text = this.logs();
    fs.rmSync(this.dir, { recursive: true, force: true });
    for (const m of SANITIZER_MARKERS) {
      if (text.includes(m)) throw new Error(`sanitizer report in polygw output:\n${text}`);
    }
    if (code !== 0) throw new Error(`polygw exited with ${code}:\n${text}`);
  }
}

function canConnect(p) {
  return new Promise((resolve) => {
    const s = net.createConnection({ path: p });
    s.once("connect", () => { s.destroy(); resolve(true); });
    s.once("error", () => resolve(false));
  });
}

/** Per test: a mock and a sidecar on it, both checked at the end. */
export async function withSidecar(opts, fn) {
  const up = await Mock.start();
  let sc;
  try {
    sc = await Sidecar.start(configText(up.url, opts));
    return await fn(sc, up);
  } finally {
    try {
      if (sc) await sc.finish();
    } finally {
      await up.stop();
    }
  }
}

/** An OpenAI chat body; `mock` becomes the mock's behaviour. */
export function chat(text = "hello", mock) {
  const body = { model: "m", messages: [{ role: "user", content: text }] };
  if (mock) body.mock = mock;
  return body;
}

/**
 * A private redis-server on a free loopback port (no persistence), for the
 * Redis backend; null when redis-server is not installed.
 */
export class RedisServer {
  static async start() {
    const exe = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"].find((p) => fs.existsSync(p));
    if (!exe) return null;
    const r = new RedisServer();
    r.dir = fs.mkdtempSync(path.join(os.tmpdir(), "pgwredis"));
    for (let attempt = 0; attempt < 5; attempt++) {
      r.port = await freePort();
      r.proc = spawn(exe, ["--port", String(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--daemonize", "no", "--dir", r.dir], { stdio: "ignore" });
      const deadline = Date.now() + 5000;
      while (Date.now() < deadline && r.proc.exitCode === null) {
        if (await redisPing(r.port)) return r;
        await sleep(20);
      }
      await r.stop(); // port race or slow start: another port
    }
    throw new Error("redis-server did not start");
  }

  get url() {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill("SIGTERM");
      await waitExit(this.proc, 5000);
    }
  }

  async finish() {
    await this.stop();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A TCP port free on 127.0.0.1 a moment ago. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function redisPing(port) {
  return new Promise((resolve) => {
    const s = net.createConnection({ host: "127.0.0.1", port });
    const timer = setTimeout(() => { s.destroy(); resolve(false); }, 1000);
    s.once("connect", () => s.write("PING\r\n"));
    s.once("data", (d) => { clearTimeout(timer); s.destroy(); resolve(d.toString().startsWith("+PONG")); });
    s.once("error", () => { clearTimeout(timer); resolve(false); });
  });
}
