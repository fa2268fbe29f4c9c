// The client against a scripted fake sidecar (a net.Server on a Unix socket):
// routing of pipelined answers and chunks, the fatal `error` notification,
// garbage from the peer, unknown messages, AbortSignal before sending, and
// the typed error mapping.
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";

import { encode } from "@msgpack/msgpack";

import * as pgw from "../index.js";
import { FrameReader, parseMessage } from "../index.js";

/** A fake sidecar: handler(conn) per connection; conn.recv() resolves to the next message. */
async function fakeSidecar(handler) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pgwfk"));
  const sock = path.join(dir, "s.sock");
  const errors = [];
  let accepted = 0;
  const server = net.createServer((s) => {
    accepted += 1;
    const reader = new FrameReader();
    const queue = [];
    const waiters = [];
    let ended = false;
    s.on("data", (d) => {
      reader.feed(d);
      for (const f of reader.frames()) {
        const m = parseMessage(Buffer.from(f));
        const msg = m.type === 2 ? [2, m.method, m.params] : [m.type, m.msgid, m.method ?? m.error, m.params ?? m.result];
        if (waiters.length) waiters.shift()(msg);
        else queue.push(msg);
      }
    });
    s.on("end", () => { ended = true; while (waiters.length) waiters.shift()(null); });
    s.on("error", () => {});
    const conn = {
      socket: s,
      recv: () => (queue.length ? Promise.resolve(queue.shift()) : ended ? Promise.resolve(null)
        : new Promise((r) => waiters.push(r))),
      send: (obj) => s.write(obj instanceof Uint8Array ? obj : encode(obj)),
    };
    Promise.resolve(handler(conn)).catch((e) => errors.push(e)).finally(() => s.end());
  });
  await new Promise((r) => server.listen(sock, r));
  return {
    path: sock,
    get accepted() { return accepted; },
    async close() {
      await new Promise((r) => server.close(r));
      fs.rmSync(dir, { recursive: true, force: true });
      if (errors.length) throw errors[0];
    },
  };
}

test("every wire code has its class, retry-later and task-not-running bases", () => {
  const codes = ["stalled", "retry_exhausted", "upstream_rejected", "deadline_exceeded", "cancelled",
    "task_stopped", "watchdog_timeout", "stream_interrupted", "backend_unavailable",
    "budget_exhausted", "bad_request", "unknown_method", "unknown_capability", "too_large", "overloaded", "shutting_down", "internal"];
  assert.deepEqual(Object.keys(pgw.ERROR_CLASSES).sort(), [...codes].sort());
  const later = ["stalled", "retry_exhausted", "backend_unavailable", "overloaded", "shutting_down"];
  for (const code of codes) {
    const e = pgw.errorFromWire({ code, message: "m" });
    assert.equal(e.constructor, pgw.ERROR_CLASSES[code]);
    assert.equal(e.code, code);
    assert.ok(e instanceof pgw.PolygwError && e instanceof Error);
    assert.equal(e.retryLater, later.includes(code));
    assert.equal(e instanceof pgw.RetryLaterError, later.includes(code));
    assert.equal(e instanceof pgw.TaskNotRunningError, ["task_stopped", "watchdog_timeout"].includes(code));
    assert.equal(e.name, e.constructor.name);
  }
});

test("error attributes, unknown codes, tasks not supported", () => {
  const e = pgw.errorFromWire({
    code: "upstream_rejected", message: "no", status: 400, attempts: 1, retry_after_s: 0.5, stalled_s: 0,
    upstream_body: { error: { type: "invalid_request_error" } }, sources: [{ name: "a", reason: "http_4xx" }],
    future_key: [1],
  });
  assert.ok(e instanceof pgw.UpstreamRejectedError);
  assert.deepEqual([e.status, e.attempts, e.retryAfterS, e.stalledS], [400, 1, 0.5, 0]);
  assert.equal(e.upstreamBody.error.type, "invalid_request_error");
  assert.deepEqual(e.sources, [{ name: "a", reason: "http_4xx" }]);
  assert.deepEqual(e.data.future_key, [1]);
  assert.equal(e.message, "no");
  const u = pgw.errorFromWire({ code: "quota_exhausted", message: "later" });
  assert.ok(u instanceof pgw.InternalError);
  assert.equal(u.code, "quota_exhausted");
  const t = pgw.errorFromWire({ code: "unknown_method", message: "x" }, "task.start");
  assert.ok(t instanceof pgw.TasksNotSupportedError && t instanceof pgw.UnknownMethodError);
  assert.match(t.message, /not supported/);
  assert.equal(pgw.errorFromWire({ code: "stalled" }).retryAfterS, null);
});

test("socket path from argument, POLYGW_SOCKET, default", () => {
  const saved = process.env.POLYGW_SOCKET;
  try {
    delete process.env.POLYGW_SOCKET;
    assert.equal(new pgw.Client().socketPath, "/run/polygw/polygw.sock");
    process.env.POLYGW_SOCKET = "/tmp/x.sock";
    assert.equal(new pgw.Client().socketPath, "/tmp/x.sock");
    assert.equal(new pgw.Client({ requestTimeoutS: 1 }).socketPath, "/tmp/x.sock");
    assert.equal(new pgw.Client("/tmp/y.sock").socketPath, "/tmp/y.sock");
    assert.equal(new pgw.Client({ socketPath: "/tmp/z.sock" }).socketPath, "/tmp/z.sock");
  } finally {
    if (saved === undefined) delete process.env.POLYGW_SOCKET;
    else process.env.POLYGW_SOCKET = saved;
  }
});

test("connect failure is typed", async () => {
  const c = new pgw.Client("/tmp/pgw-no-such.sock");
  await assert.rejects(c.ping(), (e) => e instanceof pgw.ConnectFailedError && e.code === "connect_failed");
});

test("pipelined answers out of order, chunks routed, noise ignored", async () => {
  const f = await fakeSidecar(async (c) => {
    const reqs = [await c.recv(), await c.recv(), await c.recv()];
    assert.deepEqual(reqs.map((r) => r[2]), ["ping", "call", "stats"]);
    assert.deepEqual(reqs[1][3], [{ capability: "chat", body: { x: 1 }, stream: true, deadline_s: 2.5 }]);
    const [ping, call, stats] = reqs;
    c.send([2, "hello_from_the_future", [1]]);
    c.send([0, 99, "ping", []]);
    c.send([1, stats[1], null, { n: 3 }]);
    c.send([2, "chunk", [12345, { stray: true }]]);
    c.send([2, "chunk", [call[1], { i: 0 }]]);
    const bytes = Buffer.concat([encode([2, "chunk", [call[1], { i: 1 }]]), encode([1, ping[1], null, { version: "9" }])]);
    for (const b of bytes) {
      c.socket.write(Buffer.from([b]));
      await new Promise((r) => setImmediate(r));
    }
    c.send([1, call[1], null, { source: "a" }]);
    assert.equal(await c.recv(), null);
  });
  const c = new pgw.Client(f.path);
  const ping = c.ping();
  await new Promise((r) => setImmediate(r));
  const streamP = c.call("chat", { x: 1 }, { stream: true, deadlineS: 2.5 });
  const stream = await streamP;
  const stats = c.stats();
  const events = [];
  for await (const ev of stream) events.push(ev);
  assert.deepEqual(events, [{ i: 0 }, { i: 1 }]);
  assert.deepEqual(stream.result, { source: "a" });
  assert.deepEqual(await ping, { version: "9" });
  assert.deepEqual(await stats, { n: 3 });
  await c.close();
  await f.close();
});

for (const [notification, code] of [
  [{ code: "too_large", message: "message exceeds max_message_bytes" }, "too_large"],
  [{ code: "overloaded", message: "too many connections" }, "overloaded"],
]) {
  test(`fatal error notification (${code}) fails every pending request`, async () => {
    const f = await fakeSidecar(async (c) => {
      await c.recv();
      await c.recv();
      c.send(Buffer.concat([encode([2, "error", [notification]]), encode([1, 1, null, {}])]));
    });
    const c = new pgw.Client(f.path);
    const results = await Promise.allSettled([c.ping(), c.call("chat", {})]);
    for (const r of results) {
      assert.equal(r.status, "rejected");
      assert.ok(r.reason instanceof pgw.ConnectionLostError);
      assert.equal(r.reason.code, code);
      assert.equal(r.reason.retryLater, code === "overloaded");
    }
    await c.close();
    await f.close();
  });
}

test("garbage from the sidecar is a protocol error", async () => {
  const f = await fakeSidecar(async (c) => {
    await c.recv();
    c.socket.write(Buffer.from([0xc1]));
    await c.recv();
  });
  const c = new pgw.Client(f.path);
  await assert.rejects(c.ping(), pgw.ProtocolError);
  await c.close();
  await f.close();
});

test("EOF fails pending requests, the next one reconnects", async () => {
  let n = 0;
  const f = await fakeSidecar(async (c) => {
    n += 1;
    const req = await c.recv();
    if (n === 1) return; // close without answering
    c.send([1, req[1], null, { version: "again" }]);
    await c.recv();
  });
  const c = new pgw.Client(f.path);
  await assert.rejects(c.ping(), (e) => e instanceof pgw.ConnectionLostError && e.code === "connection_lost" && e.retryLater);
  assert.deepEqual(await c.ping(), { version: "again" });
  assert.equal(f.accepted, 2);
  await c.close();
  await f.close();
});

test("client timeout and AbortSignal send cancel and wait for the answer", async () => {
  const seen = [];
  const f = await fakeSidecar(async (c) => {
    for (;;) {
      const req = await c.recv();
      if (req === null) return;
      seen.push(await c.recv()); // the cancel
      c.send([1, req[1], { code: "cancelled", message: "cancelled" }, null]);
    }
  });
  const c = new pgw.Client(f.path);
  await assert.rejects(c.call("chat", {}, { timeoutS: 0.05 }), pgw.ClientTimeoutError);
  const ac = new AbortController();
  const p = c.call("chat", {}, { signal: ac.signal });
  setTimeout(() => ac.abort(new Error("user gave up")), 20);
  await assert.rejects(p, (e) => e instanceof pgw.CancelledError && e.cause?.message === "user gave up");
  // aborted while the connection is being opened: sent, then cancelled
  await c.close();
  const c2 = new pgw.Client(f.path);
  const ac2 = new AbortController();
  const p2 = c2.call("chat", {}, { signal: ac2.signal });
  ac2.abort();
  await assert.rejects(p2, pgw.CancelledError);
  await c2.close();
  assert.deepEqual(seen.map((m) => m.slice(0, 2)), [[2, "cancel"], [2, "cancel"], [2, "cancel"]]);
  // already aborted: nothing is sent
  await assert.rejects(c2.call("chat", {}, { signal: AbortSignal.abort() }), pgw.CancelledError);
  await f.close();
});

test("an unanswered cancel is bounded by cancelTimeoutS", async () => {
  const f = await fakeSidecar(async (c) => {
    while ((await c.recv()) !== null); // requests and cancels, never answered
  });
  const c = new pgw.Client(f.path, { cancelTimeoutS: 0.1 });
  const t0 = Date.now();
  await assert.rejects(c.call("chat", {}, { timeoutS: 0.05 }), pgw.ClientTimeoutError);
  const ac = new AbortController();
  const p = c.call("chat", {}, { signal: ac.signal });
  setTimeout(() => ac.abort(), 10);
  await assert.rejects(p, pgw.CancelledError);
  const stream = await c.call("chat", {}, { stream: true });
  await stream.cancel();
  await assert.rejects(stream.next(), pgw.CancelledError);
  assert.ok(Date.now() - t0 < 2000);
  await c.close();
  await f.close();
});
