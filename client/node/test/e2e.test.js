// The end-to-end scenario against the real sidecar and the real mock
// upstream: success, streaming, every error code a test can provoke,
// AbortSignal cancellation closing the upstream connection, pipelining,
// reconnection after a sidecar restart, and tasks (when the sidecar has them).
import assert from "node:assert/strict";
import { test } from "node:test";

import * as pgw from "../index.js";
import { chat, withSidecar } from "./helpers.js";

const CLOSE_BOUND_MS = 50; // cancel -> upstream connection closed (as tests/integration)
const NO_TASKS = "the sidecar answers unknown_method to task.* (PROTOCOL §4.4 not implemented yet)";

async function upstreamClosed(up, t0, aborted = 1) {
  await up.waitStats((s) => s.open_connections === 0 && s.aborted_by_peer === aborted);
  return Date.now() - t0;
}

// until the mock holds n requests unanswered (a hang is in place)
const inProgress = (up, n = 1) => up.waitStats((s) => s.in_progress === n, 10000);

async function tasksSupported(client) {
  try {
    await client.task(`probe-${process.pid}`).get();
  } catch (e) {
    if (e instanceof pgw.TasksNotSupportedError) return false;
  }
  return true;
}

test("success: ping, call, stats", () => withSidecar({}, async (sc, up) => {
  const c = new pgw.Client(sc.sock);
  try {
    assert.ok((await c.ping()).version);
    const res = await c.call("chat", chat("Say hi"));
    assert.equal(res.body.choices[0].message.content, "Say hi");
    assert.equal(res.source, "a");
    assert.equal(res.attempts, 1);
    assert.ok(res.usage.total_tokens > 0);
    assert.equal(typeof res.elapsed_s, "number");
    const st = await c.stats();
    assert.ok(st.requests.served >= 2);
    assert.deepEqual((await up.last()).json.messages, [{ role: "user", content: "Say hi" }]);
  } finally {
    await c.close();
  }
}));

test("streaming: chunks arrive before the end", () => withSidecar({}, async (sc, up) => {
  const c = new pgw.Client(sc.sock);
  try {
    const t0 = Date.now();
    const stream = await c.call("chat", chat("abcdefghijkl", { stream_events: 4, stream_interval_ms: 100 }), { stream: true });
    const seen = [];
    for await (const ev of stream) seen.push([Date.now() - t0, ev]);
    const tEnd = Date.now() - t0;
    const text = seen.map(([, ev]) => ev.choices?.[0]?.delta?.content ?? "").join("");
    assert.equal(text, "abcdefghijkl");
    assert.ok(seen.length >= 5);
    assert.ok(seen[0][0] < tEnd - 250, `first chunk only at the end: ${seen.map(([t]) => t)}`);
    assert.equal(stream.result.source, "a");
    assert.equal(stream.result.body, undefined);
    assert.ok(stream.result.usage.completion_tokens > 0);
    assert.equal((await up.last()).json.stream, true);
  } finally {
    await c.close();
  }
}));

test("typed errors, pipelined on one connection", () => {
  const w = 0.3;
  return withSidecar({ defaults: { stall_window_s: w }, source: { timeout_s: w, ttft_timeout_s: w, idle_timeout_s: w, connect_timeout_s: w } }, async (sc) => {
    const c = new pgw.Client(sc.sock);
    try {
      const cases = [
        [c.call("chat", chat(), { deadlineS: -1 }), pgw.BadRequestError, "bad_request"],
        [c.request("no.such.method"), pgw.UnknownMethodError, "unknown_method"],
        [c.call("no-such-capability", chat()), pgw.UnknownCapabilityError, "unknown_capability"],
        [c.call("chat", chat("x", { status: 400 })), pgw.UpstreamRejectedError, "upstream_rejected"],
        [c.call("chat", chat("x", { status: 500 })), pgw.RetryExhaustedError, "retry_exhausted"],
        [c.call("chat", chat("x", { delay_ms: 2000 }), { deadlineS: 0.1 }), pgw.DeadlineExceededError, "deadline_exceeded"],
        [c.call("chat", chat("x", { status: 429 })), pgw.StalledError, "stalled"],
      ];
      const got = await Promise.allSettled(cases.map(([p]) => p));
      got.forEach((r, i) => {
        const [, cls, code] = cases[i];
        assert.equal(r.status, "rejected", code);
        assert.equal(r.reason.constructor, cls, `${code}: ${r.reason}`);
        assert.equal(r.reason.code, code);
        assert.ok(r.reason.message);
      });
      const rejected = got[3].reason;
      assert.equal(rejected.status, 400);
      assert.equal(rejected.attempts, 1);
      assert.equal(rejected.upstreamBody.error.type, "invalid_request_error");
      assert.equal(rejected.sources[0].name, "a");
      assert.equal(got[4].reason.sources[0].reason, "http_5xx");
      const stalled = got[6].reason;
      assert.ok(stalled instanceof pgw.RetryLaterError && stalled.retryLater);
      assert.ok(stalled.stalledS >= w * 0.9);
      assert.equal(typeof stalled.retryAfterS, "number");
      assert.deepEqual(got.map((r) => r.reason instanceof pgw.RetryLaterError), [false, false, false, false, true, false, true]);
      assert.ok((await c.ping()).version); // still usable
    } finally {
      await c.close();
    }
  });
});

test("AbortSignal cancels the call and closes the upstream connection", () => withSidecar({}, async (sc, up) => {
  const c = new pgw.Client(sc.sock);
  try {
    const ac = new AbortController();
    const p = c.call("chat", chat("x", { hang: "before_headers" }), { signal: ac.signal });
    await inProgress(up);
    const t0 = Date.now();
    ac.abort();
    await assert.rejects(p, (e) => e instanceof pgw.CancelledError && e.code === "cancelled" && e.cause?.name === "AbortError");
    const closed = await upstreamClosed(up, t0);
    console.log(`timing: abort -> upstream connection closed <= ${closed} ms`);
    assert.ok(closed < CLOSE_BOUND_MS, `${closed} ms`);
    // a stream: abort mid-way, then break out of another one
    const ac2 = new AbortController();
    const stream = await c.call("chat", chat("abcdefgh", { stream_events: 8, stream_interval_ms: 200 }), { stream: true, signal: ac2.signal });
    const first = await stream.next();
    assert.ok(first.value.choices[0].delta.content);
    const t1 = Date.now();
    ac2.abort();
    await assert.rejects(stream.next(), pgw.CancelledError);
    assert.ok(await upstreamClosed(up, t1, 2) < CLOSE_BOUND_MS);
    const t2 = Date.now();
    for await (const ev of await c.call("chat", chat("abcdefgh", { stream_events: 8, stream_interval_ms: 200 }), { stream: true })) {
      assert.ok(ev);
      break; // return() cancels and waits for the answer
    }
    assert.ok(await upstreamClosed(up, t2, 3) < 200 + CLOSE_BOUND_MS);
    const st = await c.stats();
    assert.equal(st.rejected.cancelled, 3);
  } finally {
    await c.close();
  }
}));

test("pipelined calls share one connection and finish in any order", () => withSidecar({}, async (sc) => {
  const c = new pgw.Client(sc.sock);
  try {
    await c.connect();
    const conn = c._conn;
    const order = [];
    await Promise.all([400, 250, 100, 0].map(async (delay, i) => {
      const res = await c.call("chat", chat(`n${i}`, { delay_ms: delay }));
      order.push(res.body.choices[0].message.content);
    }));
    assert.deepEqual(order, ["n3", "n2", "n1", "n0"]);
    assert.equal(c._conn, conn);
  } finally {
    await c.close();
  }
}));

test("reconnects after the sidecar restarts", () => withSidecar({ grace: 0.3 }, async (sc, up) => {
  const c = new pgw.Client(sc.sock);
  try {
    assert.ok((await c.ping()).version);
    const pending = c.call("chat", chat("x", { hang: "before_headers" })).then(() => null, (e) => e);
    await inProgress(up);
    assert.equal(await sc.stop(), 0);
    const err = await pending; // answered shutting_down after the grace period
    assert.ok(err instanceof pgw.ShuttingDownError || err instanceof pgw.ConnectionLostError, String(err));
    assert.ok(err.retryLater);
    await assert.rejects(c.ping(), pgw.ConnectFailedError);
    await sc.start(); // same socket path
    assert.ok((await c.ping()).uptime_s < 5);
    assert.equal((await c.call("chat", chat("back"))).body.choices[0].message.content, "back");
  } finally {
    await c.close();
  }
}));

test("task stop ends the task's call", (t) => withSidecar({}, async (sc, up) => {
  const c = new pgw.Client(sc.sock);
  const other = new pgw.Client(sc.sock);
  try {
    if (!(await tasksSupported(c))) {
      t.skip(NO_TASKS);
      return;
    }
    const id = `js-${process.pid}`;
    await assert.rejects(c.task(id).run((task) => task.node("build_skeleton", async () => {
      setTimeout(() => other.task(id).stop("user asked").catch(() => {}), 200);
      await task.call("chat", chat("x", { hang: "before_headers" }));
    })), pgw.TaskStoppedError);
    await upstreamClosed(up, Date.now());
    const info = await other.task(id).get();
    assert.equal(info.state, "failed");
    assert.equal(info.reason_kind, "stopped");
    await assert.rejects(other.task(id).guard(), pgw.TaskStoppedError);
    // a task that ends well
    const ok = `js-ok-${process.pid}`;
    await c.task(ok).run((task) => task.node("plan", () => task.call("chat", chat("in a task")), { timeoutS: 30 }));
    assert.equal((await c.task(ok).get()).state, "succeeded");
    assert.ok((await c.tasks({ state: "succeeded" })).some((x) => x.task_id === ok));
  } finally {
    await c.close();
    await other.close();
  }
}));

test("tasks on a sidecar without them are reported as not supported", (t) => withSidecar({}, async (sc) => {
  const c = new pgw.Client(sc.sock);
  try {
    if (await tasksSupported(c)) {
      t.skip("this sidecar has the task methods");
      return;
    }
    await assert.rejects(c.task("x").start(), (e) => e instanceof pgw.TasksNotSupportedError && e instanceof pgw.UnknownMethodError);
    // a call naming a task is accepted and the task ignored (PROTOCOL §4.3)
    assert.equal((await c.call("chat", chat("t"), { taskId: "x" })).attempts, 1);
  } finally {
    await c.close();
  }
}));

