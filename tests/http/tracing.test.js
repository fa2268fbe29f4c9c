// Traces: what polygw exports over OTLP/HTTP, decoded by the OpenTelemetry
// project's own protobuf definitions (otlp.js), for a call that waited for
// a permit, got a 429 with Retry-After, failed over and succeeded; the
// caller's traceparent as the parent (HTTP header and the msgpack `trace`
// parameter) or as a link; each attempt's own traceparent upstream; and no
// body text or key anywhere in what was sent.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import test from "node:test";

import { Mock, Sidecar, freePort, sleep } from "../../client/node/test/helpers.js";
import * as pgw from "../../client/node/index.js";
import { canConnect } from "./front.js";
import { Receiver, SpanKind, StatusCode } from "./otlp.js";

const PROMPT = "SECRET-PROMPT-7f3a";
const ANSWER = "SECRET-ANSWER-91c2";
const KEY = "sk-trace-KEY-5d1e";
const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID = "00f067aa0ba902b7";
const TRACEPARENT = `00-${TRACE_ID}-${PARENT_ID}-01`;

const SRC = "timeout_s: 20, connect_timeout_s: 5, ttft_timeout_s: 20, idle_timeout_s: 20, " +
  "api_key_env: PGW_TRACE_KEY";

function config(a, b, port, recv, tracing = "", aExtra = "", aCap = "chat") {
  return [
    "listen:", '  mode: "0660"',
    "server:", "  log_level: info", "  shutdown_grace_s: 0.5",
    "defaults: {max_attempts: 3, stall_window_s: 20, backoff_base_s: 0.05, backoff_max_s: 0.1, poll_interval_s: 0.05}",
    "http:", `  listen: "127.0.0.1:${port}"`,
    "tracing:", "  enabled: true", `  endpoint: "${recv.url}"`,
    ...(tracing.includes("export_interval_s") ? [] : ["  export_interval_s: 0.1"]),
    ...(tracing ? [tracing] : []),
    ...(aCap === "chat" ? [] : ["capabilities:", `  ${aCap}: {path: /${aCap}}`]),
    "sources:",
    `  - {name: a, capability: ${aCap}, base_url: "${aCap === "gemini" ? `http://127.0.0.1:${a.port}/v1beta` : a.url}", priority: 0, max_concurrency: 1, aimd: {initial: 1}, ${SRC}${aExtra}}`,
    `  - {name: b, capability: chat, base_url: "${b.url}", priority: 1, max_concurrency: 1, aimd: {initial: 1}, breaker: {failures: 100000}, prices: {input: 2.5, output: 10}, ${SRC}}`,
    "",
  ].join("\n");
}

/** Runs fn({a, b, recv, port, sc}): two mocks (sources a and b), a receiver, a sidecar. */
async function withTracing(fn, tracing = "", aExtra = ", breaker: {failures: 100000}", aCap = "chat",
  edit = (text) => text) {
  const a = await Mock.start();
  const b = await Mock.start();
  const recv = await Receiver.start();
  let sc;
  process.env.PGW_TRACE_KEY = KEY;
  try {
    const port = await freePort();
    sc = new Sidecar("");
    fs.writeFileSync(sc.configPath, edit(config(a, b, port, recv, tracing, aExtra, aCap)));
    await sc.start();
    while (!(await canConnect(port))) await sleep(20);
    return await fn({ a, b, recv, port, sc });
  } finally {
    delete process.env.PGW_TRACE_KEY;
    try {
      if (sc) await sc.finish();
    } finally {
      await recv.stop();
      await a.stop();
      await b.stop();
    }
  }
}

function chatCall(port, headers = {}, mock) {
  const body = { model: "m", messages: [{ role: "user", content: PROMPT }] };
  if (mock) body.mock = mock;
  return fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
}

test("a call that waited for a permit, got a 429 with Retry-After, failed over and succeeded", async () => {
  await withTracing(async ({ a, b, recv, port }) => {
    // a: the blocker holds its one permit for 400 ms, then the traced call
    // gets a 429 with Retry-After: 1. b: its blocker holds it for 1.2 s,
    // then the traced call succeeds there.
    await a.control("POST", "/_mock/script", [{ delay_ms: 400 }, { status: 429, retry_after: 1 }]);
    await b.control("POST", "/_mock/script", [{ delay_ms: 1200 }, { content: ANSWER }]);
    const blockA = chatCall(port);
    await a.waitStats((s) => s.requests >= 1);
    const blockB = chatCall(port);
    await b.waitStats((s) => s.requests >= 1);
    const res = await chatCall(port, { traceparent: TRACEPARENT, tracestate: "vendor=x" });
    assert.equal(res.status, 200);
    const reply = await res.json();
    assert.equal(reply.choices[0].message.content, ANSWER);
    assert.equal((await blockA).status, 200);
    assert.equal((await blockB).status, 200);

    const spans = await recv.waitFor((s) => s.filter((x) => x.traceId === TRACE_ID).length >= 3);
    const mine = spans.filter((x) => x.traceId === TRACE_ID);
    const calls = mine.filter((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    const attempts = mine.filter((x) => x.kind === SpanKind.SPAN_KIND_CLIENT);
    assert.equal(calls.length, 1, "one call span");
    assert.equal(attempts.length, 2, "two attempt spans");
    const call = calls[0];
    // The parent is the caller's span; the tracestate travels along.
    assert.equal(call.parentSpanId, PARENT_ID);
    assert.equal(call.traceState, "vendor=x");
    assert.equal(call.attrs["polygw.capability"], "chat");
    assert.equal(call.attrs["gen_ai.operation.name"], "chat");
    assert.equal(call.attrs["gen_ai.request.model"], "m");
    assert.equal(call.attrs["polygw.code"], "ok");
    assert.equal(call.attrs["polygw.attempts"], 2);
    assert.equal(call.attrs["polygw.source"], "b");
    assert.equal(call.attrs["polygw.front"], "http");
    assert.ok(call.attrs["polygw.cost"] > 0, "the answer's cost at b's prices");
    assert.ok(call.attrs["polygw.app"]);
    assert.equal(call.resource["service.name"], "polygw");
    assert.notEqual(call.status.code, StatusCode.STATUS_CODE_ERROR);

    attempts.sort((x, y) => x.startMs - y.startMs);
    const [first, second] = attempts;
    for (const s of attempts) {
      assert.equal(s.parentSpanId, call.spanId, "attempts are children of the call span");
      assert.ok(s.startMs >= call.startMs && s.endMs <= call.endMs + 1, "inside the call span");
      assert.equal(s.attrs["gen_ai.provider.name"], "openai");
      assert.equal(s.attrs["gen_ai.system"], "openai");
      assert.equal(s.attrs["gen_ai.request.model"], "m");
      assert.equal(s.attrs["server.address"], "127.0.0.1");
    }
    assert.equal(Number(first.attrs["server.port"]), a.port);
    assert.equal(Number(second.attrs["server.port"]), b.port);
    assert.equal(first.name, "chat m");
    assert.equal(first.attrs["polygw.source"], "a");
    assert.equal(first.attrs["http.response.status_code"], 429);
    assert.equal(first.attrs["error.type"], "http_429");
    assert.equal(first.attrs["polygw.retry_after_s"], 1);
    assert.equal(first.status.code, StatusCode.STATUS_CODE_ERROR);
    assert.equal(second.attrs["polygw.source"], "b");
    assert.equal(second.attrs["http.response.status_code"], 200);
    assert.ok(second.attrs["gen_ai.usage.input_tokens"] > 0);
    assert.ok(second.attrs["gen_ai.usage.output_tokens"] > 0);
    assert.ok(second.events.some((e) => e.name === "polygw.first_byte"));

    // The events, in order, each wait with its duration.
    const names = call.events.map((e) => e.name);
    const at = (n) => names.indexOf(n);
    assert.ok(at("polygw.permit_wait") >= 0, names.join());
    assert.ok(at("polygw.retry_after") > at("polygw.permit_wait"), names.join());
    assert.ok(at("polygw.failover") > at("polygw.retry_after"), names.join());
    const permit = call.events[at("polygw.permit_wait")];
    assert.ok(permit.attrs["polygw.duration_s"] > 0.2 && permit.attrs["polygw.duration_s"] < 5,
      JSON.stringify(permit));
    assert.ok(permit.timeMs <= first.startMs + 1, "the permit wait came before the first attempt");
    // The Retry-After honoured: a held off for 1 s, and the call waited
    // for a source (a held, b busy) before failing over to b.
    const ra = call.events[at("polygw.retry_after")];
    assert.equal(ra.attrs["polygw.retry_after_s"], 1);
    assert.equal(ra.attrs["polygw.source"], "a");
    assert.ok(Math.abs(ra.timeMs - first.endMs) < 2);
    const held = call.events.slice(at("polygw.retry_after"), at("polygw.failover"))
      .filter((e) => e.attrs["polygw.reason"] === "retry_after");
    assert.ok(held.length >= 1, names.join());
    const waited = held.reduce((t, e) => t + e.attrs["polygw.duration_s"], 0);
    assert.ok(waited > 0.3 && waited < 5, JSON.stringify(call.events));
    const fo = call.events[at("polygw.failover")];
    assert.equal(fo.attrs["polygw.from"], "a");
    assert.equal(fo.attrs["polygw.to"], "b");
    for (let i = 1; i < call.events.length; i++)
      assert.ok(call.events[i].timeMs >= call.events[i - 1].timeMs, "events in time order");

    // Each attempt sent its own traceparent upstream.
    const lastB = await b.last();
    const tp = Object.entries(lastB.headers).find(([k]) => k.toLowerCase() === "traceparent");
    assert.ok(tp, JSON.stringify(lastB.headers));
    assert.equal(tp[1], `00-${TRACE_ID}-${second.spanId}-01`);

    // No body text, no key, anywhere in what reached the receiver.
    for (const body of recv.bodies) {
      const text = body.toString("latin1");
      for (const secret of [PROMPT, ANSWER, KEY]) assert.ok(!text.includes(secret), secret);
    }
    assert.deepEqual([...recv.contentTypes], ["application/x-protobuf"]);
  });
});

test("without a traceparent the call span is a root; parent: link makes a link instead", async () => {
  await withTracing(async ({ recv, port }) => {
    const res = await chatCall(port, { traceparent: TRACEPARENT });
    assert.equal(res.status, 200);
    await res.json();
    const spans = await recv.waitFor((s) => s.some((x) => x.kind === SpanKind.SPAN_KIND_SERVER));
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    assert.notEqual(call.traceId, TRACE_ID);
    assert.equal(call.parentSpanId, "");
    assert.deepEqual(call.links, [{ traceId: TRACE_ID, spanId: PARENT_ID }]);
  }, "  parent: link");
  await withTracing(async ({ recv, port }) => {
    const res = await chatCall(port, { traceparent: "00-zz-bad-01" });
    assert.equal(res.status, 200);
    await res.json();
    const spans = await recv.waitFor((s) => s.some((x) => x.kind === SpanKind.SPAN_KIND_SERVER));
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    assert.equal(call.parentSpanId, "");
    assert.equal(call.links.length, 0);
  });
});

test("an unsampled caller's trace records nothing; sampler_ratio 0 records no root", async () => {
  await withTracing(async ({ recv, port }) => {
    const res = await chatCall(port, { traceparent: `00-${TRACE_ID}-${PARENT_ID}-00` });
    assert.equal(res.status, 200);
    await res.json();
    const res2 = await chatCall(port);
    assert.equal(res2.status, 200);
    await res2.json();
    await sleep(500);
    assert.equal(recv.spans.length, 0);
    const res3 = await chatCall(port, { traceparent: TRACEPARENT });
    await res3.json();
    await recv.waitFor((s) => s.length >= 2);
    assert.ok(recv.spans.every((x) => x.traceId === TRACE_ID), "only the sampled caller's trace");
  }, "  sampler_ratio: 0");
});

test("the msgpack `trace` parameter (the Node client's `trace` option) makes the call a child", async () => {
  await withTracing(async ({ recv, sc }) => {
    const c = new pgw.Client(sc.sock);
    try {
      const r = await c.call("chat", { model: "m", messages: [{ role: "user", content: PROMPT }] },
        { trace: { traceparent: TRACEPARENT, tracestate: "k=v", baggage: "ignored=1" } });
      assert.equal(r.source, "a");
      await assert.rejects(
        c.call("chat", { model: "m", messages: [] }, { trace: { traceparent: 7 } }),
        (e) => e.code === "bad_request" && /traceparent must be a string/.test(e.message));
    } finally {
      c.close();
    }
    const spans = await recv.waitFor((s) => s.filter((x) => x.traceId === TRACE_ID).length >= 2);
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    assert.equal(call.traceId, TRACE_ID);
    assert.equal(call.parentSpanId, PARENT_ID);
    assert.equal(call.traceState, "k=v");
    assert.equal(call.attrs["polygw.front"], "msgpack");
    const attempt = spans.find((x) => x.kind === SpanKind.SPAN_KIND_CLIENT);
    assert.equal(attempt.parentSpanId, call.spanId);
  });
});

test("a source whose breaker is open is told skipped, once per call", async () => {
  await withTracing(async ({ a, recv, port }) => {
    await a.control("POST", "/_mock/script", [{ status: 500 }]);
    const first = await chatCall(port); // a answers 500: its breaker opens; b serves
    assert.equal(first.status, 200);
    await first.json();
    const res = await chatCall(port, { traceparent: TRACEPARENT });
    assert.equal(res.status, 200);
    await res.json();
    const spans = await recv.waitFor((s) => s.filter((x) => x.traceId === TRACE_ID).length >= 2);
    const call = spans.find((x) => x.traceId === TRACE_ID && x.kind === SpanKind.SPAN_KIND_SERVER);
    const skips = call.events.filter((e) => e.name === "polygw.breaker_skip");
    assert.equal(skips.length, 1, JSON.stringify(call.events));
    assert.equal(skips[0].attrs["polygw.source"], "a");
    assert.ok(skips[0].attrs["polygw.cooldown_s"] > 0);
    assert.equal(call.attrs["polygw.source"], "b");
    // The first call's span: the 500 on a, then the failover to b.
    const other = spans.find((x) => x.traceId !== TRACE_ID && x.kind === SpanKind.SPAN_KIND_SERVER);
    assert.ok(other.events.some((e) => e.name === "polygw.failover"));
  }, "", ", breaker: {failures: 1, cooldown_s: 30}");
});

test("the C client (polygwctl call --traceparent) sends the trace parameter", async () => {
  await withTracing(async ({ recv, sc }) => {
    const { execFileSync } = await import("node:child_process");
    const out = execFileSync(`${process.env.POLYGW_BUILD}/polygwctl`, ["--socket", sc.sock, "call", "chat",
      "--traceparent", TRACEPARENT, "--body", JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] })]);
    assert.match(out.toString(), /"choices"/);
    const spans = await recv.waitFor((s) => s.some((x) => x.kind === SpanKind.SPAN_KIND_SERVER));
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    assert.equal(call.traceId, TRACE_ID);
    assert.equal(call.parentSpanId, PARENT_ID);
    assert.equal(call.attrs["polygw.front"], "msgpack");
    // polygwctl task start --traceparent: the run's task.start joins it.
    execFileSync(`${process.env.POLYGW_BUILD}/polygwctl`, ["--socket", sc.sock, "task", "start", "run-c",
      "--traceparent", TRACEPARENT]);
    const ts = (await recv.waitFor((s) => s.some((x) => x.name === "task.start"))).find((x) => x.name === "task.start");
    assert.equal(ts.traceId, TRACE_ID);
    assert.equal(ts.parentSpanId, PARENT_ID);
    assert.equal(ts.attrs["polygw.task_id"], "run-c");
  });
});

/** POSTs task method `op` of task `id` on the HTTP front. */
function taskPost(port, id, op, body, headers = {}) {
  return fetch(`http://127.0.0.1:${port}/polygw/v1/tasks/${id}/${op}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: JSON.stringify(body || {}),
  });
}

test("a task's run is one trace: task.start under the caller, nodes, calls, the watchdog", async () => {
  await withTracing(async ({ a, recv, port }) => {
    const start = await taskPost(port, "run-1", "start", {}, { traceparent: TRACEPARENT, tracestate: "t=1" });
    assert.equal(start.status, 200);
    assert.equal((await taskPost(port, "run-1", "node_begin", { node: "plan", timeout_s: 10 })).status, 200);
    // A call of the task with no traceparent of its own: a child of the run.
    const r1 = await chatCall(port, { "X-Polygw-Task": "run-1" });
    assert.equal(r1.status, 200);
    await r1.json();
    assert.equal((await taskPost(port, "run-1", "node_end", { node: "plan" })).status, 200);
    // The next node hangs on an upstream that never answers in time: the
    // watchdog fails the task and ends its call.
    await a.control("POST", "/_mock/script", [{ delay_ms: 5000 }]);
    assert.equal((await taskPost(port, "run-1", "node_begin", { node: "act", timeout_s: 0.3 })).status, 200);
    const r2 = await chatCall(port, { "X-Polygw-Task": "run-1" });
    assert.equal(r2.status, 409);
    assert.equal((await r2.json()).error.code, "watchdog_timeout");

    const spans = await recv.waitFor((s) =>
      s.some((x) => x.name === "task.node act") && s.filter((x) => x.kind === SpanKind.SPAN_KIND_SERVER).length >= 3);
    const mine = spans.filter((x) => x.traceId === TRACE_ID);
    assert.equal(mine.length, spans.length, "every span is in the caller's trace: " + JSON.stringify(spans.map((x) => x.name)));
    const ts = mine.find((x) => x.name === "task.start");
    assert.ok(ts, JSON.stringify(mine.map((x) => x.name)));
    assert.equal(ts.kind, SpanKind.SPAN_KIND_SERVER);
    assert.equal(ts.parentSpanId, PARENT_ID);
    assert.equal(ts.traceState, "t=1");
    assert.equal(ts.attrs["polygw.task_id"], "run-1");
    assert.ok(ts.attrs["polygw.app"]);
    assert.equal(ts.attrs["polygw.runs"], 1);

    const plan = mine.find((x) => x.name === "task.node plan");
    assert.equal(plan.parentSpanId, ts.spanId);
    assert.equal(plan.attrs["polygw.node"], "plan");
    assert.equal(plan.attrs["polygw.ended_by"], "task.node_end");
    assert.equal(plan.attrs["polygw.timeout_s"], 10);
    assert.equal(plan.attrs["polygw.timeout_source"], "explicit");
    assert.notEqual(plan.status.code, StatusCode.STATUS_CODE_ERROR);

    const calls = mine.filter((x) => x.kind === SpanKind.SPAN_KIND_SERVER && x.name !== "task.start")
      .sort((x, y) => x.startMs - y.startMs);
    assert.equal(calls.length, 2, JSON.stringify(mine.map((x) => x.name)));
    for (const c of calls) {
      assert.equal(c.parentSpanId, ts.spanId, "the task's calls are children of its run");
      assert.equal(c.attrs["polygw.task_id"], "run-1");
    }
    assert.ok(calls[0].startMs >= plan.startMs && calls[0].endMs <= plan.endMs + 1, "the call ran in its node");
    assert.equal(calls[0].attrs["polygw.code"], "ok");
    assert.equal(calls[1].attrs["polygw.code"], "watchdog_timeout");
    assert.ok(calls[1].events.some((e) => e.name === "polygw.watchdog"), JSON.stringify(calls[1].events));

    const act = mine.find((x) => x.name === "task.node act");
    assert.equal(act.parentSpanId, ts.spanId);
    assert.equal(act.attrs["polygw.ended_by"], "watchdog");
    assert.equal(act.status.code, StatusCode.STATUS_CODE_ERROR);
    assert.equal(act.status.message, "watchdog_timeout");
    const fired = act.events.find((e) => e.name === "polygw.watchdog");
    assert.ok(fired && fired.attrs["polygw.reason"], JSON.stringify(act.events));
    assert.ok(act.endMs - act.startMs >= 250 && act.endMs - act.startMs < 5000, JSON.stringify(act));
  });
});

test("task.start over msgpack takes `trace`; a stop is a span of the run, and ends its node", async () => {
  await withTracing(async ({ a, recv, sc, port }) => {
    const c = new pgw.Client(sc.sock);
    try {
      await c.task("run-2").start({ trace: { traceparent: TRACEPARENT } });
      await c.request("task.node_begin", { task_id: "run-2", node: "step" });
      await assert.rejects(c.request("task.start", { task_id: "run-3", trace: { traceparent: 1 } }),
        (e) => e.code === "bad_request" && /traceparent must be a string/.test(e.message));
      // A call with its own traceparent keeps it; one without joins the run.
      const own = "00-11111111111111111111111111111111-2222222222222222-01";
      await c.call("chat", { model: "m", messages: [{ role: "user", content: PROMPT }] },
        { taskId: "run-2", trace: { traceparent: own } });
      await a.control("POST", "/_mock/script", [{ delay_ms: 5000 }]);
      const hung = chatCall(port, { "X-Polygw-Task": "run-2" });
      await a.waitStats((s) => s.requests >= 2);
      await c.request("task.stop", { task_id: "run-2", reason: "user cancelled" });
      assert.equal((await hung).status, 409);
    } finally {
      c.close();
    }
    const spans = await recv.waitFor((s) =>
      s.some((x) => x.name === "task.stop") && s.some((x) => x.name === "task.node step") &&
      s.filter((x) => x.kind === SpanKind.SPAN_KIND_SERVER).length >= 3);
    const ts = spans.find((x) => x.name === "task.start");
    assert.equal(ts.traceId, TRACE_ID);
    assert.equal(ts.parentSpanId, PARENT_ID);
    const stop = spans.find((x) => x.name === "task.stop");
    assert.equal(stop.traceId, TRACE_ID);
    assert.equal(stop.parentSpanId, ts.spanId);
    assert.equal(stop.attrs["polygw.reason"], "user cancelled");
    assert.equal(stop.attrs["polygw.node"], "step");
    assert.ok(stop.attrs["polygw.by"]);
    const step = spans.find((x) => x.name === "task.node step");
    assert.equal(step.parentSpanId, ts.spanId);
    assert.equal(step.attrs["polygw.ended_by"], "task.stop");
    assert.equal(step.status.message, "task_stopped");
    const calls = spans.filter((x) => x.kind === SpanKind.SPAN_KIND_SERVER && x.name !== "task.start");
    const ownCall = calls.find((x) => x.traceId === "11111111111111111111111111111111");
    assert.ok(ownCall, "a call's own traceparent wins over its task's");
    assert.equal(ownCall.parentSpanId, "2222222222222222");
    const stopped = calls.find((x) => x.traceId === TRACE_ID);
    assert.equal(stopped.parentSpanId, ts.spanId);
    assert.equal(stopped.attrs["polygw.code"], "task_stopped");
    assert.ok(stopped.events.some((e) => e.name === "polygw.task_stop"));
  });
});

test("with parent: link the run's calls stay children of the run; task.start links the caller", async () => {
  await withTracing(async ({ recv, port }) => {
    assert.equal((await taskPost(port, "run-4", "start", {}, { traceparent: TRACEPARENT })).status, 200);
    const r = await chatCall(port, { "X-Polygw-Task": "run-4" });
    assert.equal(r.status, 200);
    await r.json();
    assert.equal((await taskPost(port, "run-4", "node_begin", { node: "wrap" })).status, 200);
    assert.equal((await taskPost(port, "run-4", "finish", { ok: true })).status, 200);
    const spans = await recv.waitFor((s) => s.some((x) => x.name === "task.finish") &&
      s.some((x) => x.name === "task.node wrap") && s.some((x) => x.kind === SpanKind.SPAN_KIND_CLIENT));
    const ts = spans.find((x) => x.name === "task.start");
    assert.notEqual(ts.traceId, TRACE_ID);
    assert.equal(ts.parentSpanId, "");
    assert.deepEqual(ts.links, [{ traceId: TRACE_ID, spanId: PARENT_ID }]);
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER && x.name !== "task.start");
    assert.equal(call.traceId, ts.traceId);
    assert.equal(call.parentSpanId, ts.spanId);
    const fin = spans.find((x) => x.name === "task.finish");
    assert.equal(fin.parentSpanId, ts.spanId);
    assert.equal(fin.attrs["polygw.ok"], true);
    assert.equal(fin.attrs["polygw.node"], "wrap");
    const wrap = spans.find((x) => x.name === "task.node wrap");
    assert.equal(wrap.parentSpanId, ts.spanId);
    assert.equal(wrap.attrs["polygw.ended_by"], "task.finish");
    assert.equal(wrap.attrs["polygw.timeout_source"], "default");
    assert.notEqual(wrap.status.code, StatusCode.STATUS_CODE_ERROR);
  }, "  parent: link");
});

/** The spans of the one call made (its call span and its attempt span),
 * both naming `model` as gen_ai.response.model. */
async function oneCall(recv, model) {
  const spans = await recv.waitFor((s) => s.some((x) => x.kind === SpanKind.SPAN_KIND_SERVER) &&
    s.some((x) => x.kind === SpanKind.SPAN_KIND_CLIENT));
  const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
  const attempt = spans.find((x) => x.kind === SpanKind.SPAN_KIND_CLIENT);
  assert.equal(attempt.attrs["gen_ai.response.model"], model);
  assert.equal(call.attrs["gen_ai.response.model"], model);
  return [call, attempt];
}

const sse = (...events) => events.map((e) => `data: ${typeof e === "string" ? e : JSON.stringify(e)}\n\n`).join("");

test("gen_ai.response.model and cached/reasoning tokens from an OpenAI answer, plain and streamed", async () => {
  await withTracing(async ({ a, recv, port }) => {
    const usage = { prompt_tokens: 50, completion_tokens: 20, total_tokens: 70,
      prompt_tokens_details: { cached_tokens: 32 }, completion_tokens_details: { reasoning_tokens: 12 } };
    await a.control("POST", "/_mock/script", [{ body: JSON.stringify({
      id: "c1", object: "chat.completion", created: 1, model: "m-2024-08-06",
      choices: [{ index: 0, message: { role: "assistant", content: ANSWER }, finish_reason: "stop" }], usage }) }]);
    const res = await chatCall(port);
    assert.equal(res.status, 200);
    await res.json();
    const [, attempt] = await oneCall(recv, "m-2024-08-06");
    assert.equal(attempt.attrs["gen_ai.request.model"], "m");
    assert.equal(attempt.attrs["gen_ai.usage.input_tokens"], 50);
    assert.equal(attempt.attrs["gen_ai.usage.output_tokens"], 20);
    assert.equal(attempt.attrs["gen_ai.usage.cache_read.input_tokens"], 32);
    assert.equal(attempt.attrs["gen_ai.usage.reasoning.output_tokens"], 12);
    assert.equal(attempt.attrs["gen_ai.usage.cache_creation.input_tokens"], undefined);
  });
  await withTracing(async ({ a, recv, port }) => {
    const chunk = { id: "c2", object: "chat.completion.chunk", created: 1, model: "m-stream-7" };
    await a.control("POST", "/_mock/script", [{ content_type: "text/event-stream", body: sse(
      { ...chunk, choices: [{ index: 0, delta: { role: "assistant", content: "hi" }, finish_reason: null }] },
      { ...chunk, choices: [{ index: 0, delta: {}, finish_reason: "stop" }] },
      { ...chunk, choices: [], usage: { prompt_tokens: 9, completion_tokens: 8, total_tokens: 17,
        prompt_tokens_details: { cached_tokens: 4 }, completion_tokens_details: { reasoning_tokens: 5 } } },
      "[DONE]") }]);
    const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: PROMPT }] }),
    });
    assert.equal(res.status, 200);
    assert.match(await res.text(), /\[DONE\]/);
    const [call, attempt] = await oneCall(recv, "m-stream-7");
    assert.equal(call.attrs["polygw.stream"], true);
    assert.equal(attempt.attrs["gen_ai.usage.cache_read.input_tokens"], 4);
    assert.equal(attempt.attrs["gen_ai.usage.reasoning.output_tokens"], 5);
  });
});

test("gen_ai.response.model and cache tokens from an Anthropic Messages answer", async () => {
  await withTracing(async ({ a, recv, port }) => {
    await a.control("POST", "/_mock/script", [{ body: JSON.stringify({
      id: "msg_1", type: "message", role: "assistant", model: "claude-t-20250101",
      content: [{ type: "text", text: ANSWER }], stop_reason: "end_turn", stop_sequence: null,
      usage: { input_tokens: 10, output_tokens: 5, cache_read_input_tokens: 7, cache_creation_input_tokens: 3 } }) }]);
    const res = await fetch(`http://127.0.0.1:${port}/v1/messages`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "m", max_tokens: 10, messages: [{ role: "user", content: PROMPT }] }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    assert.equal((await res.json()).content[0].text, ANSWER);
    const [, attempt] = await oneCall(recv, "claude-t-20250101");
    assert.equal(attempt.attrs["gen_ai.provider.name"], "anthropic");
    assert.equal(attempt.attrs["gen_ai.usage.cache_read.input_tokens"], 7);
    assert.equal(attempt.attrs["gen_ai.usage.cache_creation.input_tokens"], 3);
    recv.spans.length = 0;
    // The mock's own stream names the model (the one asked for) in
    // message_start's `message` only.
    const st = await fetch(`http://127.0.0.1:${port}/v1/messages`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "claude-s", max_tokens: 10, stream: true, messages: [{ role: "user", content: PROMPT }] }),
    });
    assert.equal(st.status, 200);
    assert.match(await st.text(), /message_stop/);
    await oneCall(recv, "claude-s");
  }, "", ", kind: anthropic, breaker: {failures: 100000}");
});

test("gen_ai.response.model (modelVersion) and thinking tokens from a Gemini answer, plain and streamed", async () => {
  await withTracing(async ({ a, recv, port }) => {
    const usageMetadata = { promptTokenCount: 6, candidatesTokenCount: 4, thoughtsTokenCount: 9, totalTokenCount: 19 };
    await a.control("POST", "/_mock/script", [{ body: JSON.stringify({
      candidates: [{ content: { parts: [{ text: ANSWER }], role: "model" }, finishReason: "STOP", index: 0 }],
      usageMetadata, modelVersion: "gemini-t-001" }) }]);
    const res = await fetch(`http://127.0.0.1:${port}/v1beta/models/gemini-t:generateContent`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ contents: [{ role: "user", parts: [{ text: PROMPT }] }] }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    await res.json();
    const [call, attempt] = await oneCall(recv, "gemini-t-001");
    assert.equal(attempt.attrs["gen_ai.provider.name"], "gcp.gemini");
    // A custom capability's operation is its name, on the attempt as on the call.
    assert.equal(call.attrs["gen_ai.operation.name"], "gemini");
    assert.equal(attempt.attrs["gen_ai.operation.name"], "gemini");
    assert.equal(attempt.name, "gemini gemini-t");
    assert.equal(attempt.attrs["gen_ai.usage.reasoning.output_tokens"], 9);
    recv.spans.length = 0;
    // The mock's own stream: every event names its modelVersion.
    const st = await fetch(`http://127.0.0.1:${port}/v1beta/models/gemini-t:streamGenerateContent?alt=sse`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ contents: [{ role: "user", parts: [{ text: PROMPT }] }] }),
    });
    assert.equal(st.status, 200);
    await st.text();
    await oneCall(recv, "mock-gemini");
  }, "", ", kind: gemini, breaker: {failures: 100000}", "gemini");
});

test("spans still queued at shutdown are sent before the sidecar exits, within the stop timeout", async () => {
  // Exports every hour: nothing leaves before the SIGTERM.
  await withTracing(async ({ recv, port, sc }) => {
    const res = await chatCall(port, { traceparent: TRACEPARENT });
    assert.equal(res.status, 200);
    await res.json();
    await sleep(300);
    assert.equal(recv.requests, 0, "nothing exported before the shutdown");
    const t0 = Date.now();
    assert.equal(await sc.stop(), 0);
    assert.ok(Date.now() - t0 < 2000, `exited in ${Date.now() - t0} ms`);
    const mine = recv.spans.filter((x) => x.traceId === TRACE_ID);
    assert.equal(mine.length, 2, JSON.stringify(recv.spans.map((x) => x.name)));
    assert.ok(mine.some((x) => x.kind === SpanKind.SPAN_KIND_SERVER && x.parentSpanId === PARENT_ID));
  }, "  export_interval_s: 3600");
  // A receiver that never answers delays the exit by at most the stop
  // timeout (2 s after the grace), never by export_timeout_s.
  await withTracing(async ({ recv, port, sc }) => {
    const res = await chatCall(port);
    await res.json();
    recv.mode = "hang";
    const t0 = Date.now();
    assert.equal(await sc.stop(), 0);
    const took = Date.now() - t0;
    assert.ok(recv.hung.length >= 1, "the export was tried");
    assert.ok(took >= 1500 && took < 4500, `exited in ${took} ms`);
  }, "  export_interval_s: 3600\n  export_timeout_s: 30");
});

test("gen_ai.response.model from the Responses API, plain and from its stream's response events", async () => {
  await withTracing(async ({ recv, port }) => {
    const post = (body) => fetch(`http://127.0.0.1:${port}/v1/responses`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const res = await post({ model: "resp-m", input: PROMPT });
    assert.equal(res.status, 200, await res.clone().text());
    await res.json();
    const [call] = await oneCall(recv, "resp-m");
    assert.equal(call.attrs["gen_ai.operation.name"], "chat");
    recv.spans.length = 0;
    const st = await post({ model: "resp-s", input: PROMPT, stream: true });
    assert.equal(st.status, 200);
    assert.match(await st.text(), /response\.completed/);
    await oneCall(recv, "resp-s");
  }, "", ", breaker: {failures: 100000}", "responses");
});

test("a task stopped by its budget: task.stop by polygw, reason budget, in the run's trace", async () => {
  await withTracing(async ({ recv, port }) => {
    assert.equal((await taskPost(port, "run-b", "start", { budget: 1e-9 }, { traceparent: TRACEPARENT })).status, 200);
    const res = await chatCall(port, { "X-Polygw-Task": "run-b" });
    const err = (await res.json()).error;
    assert.equal(err.code, "budget_exhausted", JSON.stringify(err));
    const spans = await recv.waitFor((s) => s.some((x) => x.name === "task.stop"));
    const ts = spans.find((x) => x.name === "task.start");
    assert.equal(ts.attrs["polygw.budget"], 1e-9);
    const stop = spans.find((x) => x.name === "task.stop");
    assert.equal(stop.traceId, TRACE_ID);
    assert.equal(stop.parentSpanId, ts.spanId);
    assert.equal(stop.attrs["polygw.by"], "polygw");
    assert.equal(stop.attrs["polygw.reason"], "budget");
  }, "", ", breaker: {failures: 100000}, prices: {input: 2.5, output: 10}");
});

/** A chat call over node:http, whose header values may be arrays (sent as
 * repeated lines) and keep their spaces. */
function rawCall(port, headers) {
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: PROMPT }] });
  return new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, method: "POST", path: "/v1/chat/completions",
      headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body), ...headers } },
    (res) => {
      let text = "";
      res.on("data", (d) => { text += d; });
      res.on("end", () => resolve({ status: res.statusCode, text }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

const upHeader = (last, name) =>
  Object.entries(last.headers).filter(([k]) => k.toLowerCase() === name).map(([, v]) => v);

test("the caller's tracestate goes upstream with each attempt; repeated lines are one list", async () => {
  await withTracing(async ({ a, recv, port }) => {
    const res = await rawCall(port, { traceparent: TRACEPARENT, tracestate: ["a=1", "b=2"] });
    assert.equal(res.status, 200, res.text);
    const spans = await recv.waitFor((s) => s.filter((x) => x.traceId === TRACE_ID).length >= 2);
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    assert.equal(call.traceState, "a=1,b=2");
    const attempt = spans.find((x) => x.kind === SpanKind.SPAN_KIND_CLIENT);
    assert.equal(attempt.traceState, "a=1,b=2");
    const last = await a.last();
    assert.deepEqual(upHeader(last, "traceparent"), [`00-${TRACE_ID}-${attempt.spanId}-01`]);
    assert.deepEqual(upHeader(last, "tracestate"), ["a=1,b=2"]);
    // Not sampled: the context and the tracestate still go on.
    const quiet = await rawCall(port, { traceparent: `00-${TRACE_ID}-${PARENT_ID}-00`, tracestate: "q=1" });
    assert.equal(quiet.status, 200, quiet.text);
    const last2 = await a.last();
    const tp = upHeader(last2, "traceparent")[0].split("-");
    assert.deepEqual([tp[0], tp[1], tp[3]], ["00", TRACE_ID, "00"]);
    assert.deepEqual(upHeader(last2, "tracestate"), ["q=1"]);
    // No tracestate given: none sent.
    await rawCall(port, { traceparent: TRACEPARENT });
    assert.deepEqual(upHeader(await a.last(), "tracestate"), []);
  });
});

test("a traceparent with spaces around it is honoured; the caller's random flag is kept", async () => {
  await withTracing(async ({ a, recv, port }) => {
    const res = await rawCall(port, { traceparent: ` \t00-${TRACE_ID}-${PARENT_ID}-03  `, tracestate: " s=1 " });
    assert.equal(res.status, 200, res.text);
    const spans = await recv.waitFor((s) => s.filter((x) => x.traceId === TRACE_ID).length >= 2);
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    const attempt = spans.find((x) => x.kind === SpanKind.SPAN_KIND_CLIENT);
    assert.equal(call.parentSpanId, PARENT_ID);
    assert.equal(call.traceState, "s=1");
    const last = await a.last();
    assert.deepEqual(upHeader(last, "traceparent"), [`00-${TRACE_ID}-${attempt.spanId}-03`]);
    assert.deepEqual(upHeader(last, "tracestate"), ["s=1"]);
  });
});

test("a task run's tracestate goes with its spans and its calls", async () => {
  await withTracing(async ({ a, recv, port }) => {
    const start = await taskPost(port, "run-ts", "start", {}, { traceparent: TRACEPARENT, tracestate: "t=1" });
    assert.equal(start.status, 200);
    assert.equal((await taskPost(port, "run-ts", "node_begin", { node: "plan", timeout_s: 10 })).status, 200);
    const r1 = await chatCall(port, { "X-Polygw-Task": "run-ts" });
    assert.equal(r1.status, 200);
    await r1.json();
    assert.equal((await taskPost(port, "run-ts", "node_end", { node: "plan" })).status, 200);
    assert.equal((await taskPost(port, "run-ts", "finish", { ok: true })).status, 200);
    const spans = await recv.waitFor((s) => s.some((x) => x.name === "task.finish") &&
      s.some((x) => x.kind === SpanKind.SPAN_KIND_CLIENT));
    for (const name of ["task.start", "task.node plan", "task.finish"])
      assert.equal(spans.find((x) => x.name === name).traceState, "t=1", name);
    const attempt = spans.find((x) => x.kind === SpanKind.SPAN_KIND_CLIENT);
    assert.equal(attempt.traceState, "t=1");
    assert.deepEqual(upHeader(await a.last(), "tracestate"), ["t=1"]);
  });
});

test("a malformed OTEL_RESOURCE_ATTRIBUTES is discarded; a bad header name is warned about", async () => {
  const env = {
    OTEL_RESOURCE_ATTRIBUTES: "team,env=x",
    OTEL_EXPORTER_OTLP_HEADERS: "x bad=SECRETVAL2,ok=1,x-tok=SECRETVAL3",
    OTEL_TRACES_SAMPLER: "bogus_sampler",
  };
  Object.assign(process.env, env);
  try {
    await withTracing(async ({ recv, port, sc }) => {
      const res = await chatCall(port, { traceparent: TRACEPARENT });
      assert.equal(res.status, 200);
      await res.json();
      const spans = await recv.waitFor((s) => s.length >= 2);
      // The whole list discarded: none of its entries, the default service.
      assert.deepEqual(Object.keys(spans[0].resource).sort(), ["service.name", "service.version"]);
      assert.equal(spans[0].resource["service.name"], "polygw");
      assert.equal(recv.headers[0].ok, "1");
      assert.equal(recv.headers[0]["x-tok"], "SECRETVAL3");
      const logs = sc.logs();
      assert.match(logs, /"OTEL_RESOURCE_ATTRIBUTES discarded".*OTEL_RESOURCE_ATTRIBUTES: every entry must be key=value/);
      assert.match(logs, /"variable":"OTEL_EXPORTER_OTLP_HEADERS","entry":1/);
      assert.match(logs, /OTEL_TRACES_SAMPLER unknown.*"value":"bogus_sampler"/);
      assert.ok(!logs.includes("SECRETVAL"), "no header value in the logs");
    });
  } finally {
    for (const k of Object.keys(env)) delete process.env[k];
  }
});

test("a retry storm that ends stalled keeps its verdict among the span's events", async () => {
  await withTracing(async ({ recv, port }) => {
    const res = await chatCall(port, { traceparent: TRACEPARENT }, { status: 429 });
    assert.equal(res.status, 503); /* stalled */
    await res.text();
    const spans = await recv.waitFor((s) => s.some((x) => x.kind === SpanKind.SPAN_KIND_SERVER));
    const call = spans.find((x) => x.kind === SpanKind.SPAN_KIND_SERVER);
    assert.equal(call.attrs["polygw.code"], "stalled");
    assert.ok(call.attrs["polygw.attempts"] > 10, String(call.attrs["polygw.attempts"]));
    const names = call.events.map((e) => e.name);
    assert.equal(names.length, 16, names.join());
    assert.ok(call.droppedEvents > 0, String(call.droppedEvents));
    assert.equal(names[names.length - 1], "polygw.stall_verdict", names.join());
    for (let i = 1; i < call.events.length; i++)
      assert.ok(call.events[i].timeMs >= call.events[i - 1].timeMs - 1, "in time order: " + names.join());
  }, "", ", breaker: {failures: 100000}", "chat",
  (text) => text.replace("max_attempts: 3, stall_window_s: 20", "max_attempts: 1000, stall_window_s: 1.5")
    .replaceAll("ttft_timeout_s: 20", "ttft_timeout_s: 1"));
});

test("a vertex source is gen_ai.provider.name gcp.vertex_ai, whichever model family it serves", async () => {
  const tok = `${fs.mkdtempSync("/tmp/pgwvx")}/token`;
  fs.writeFileSync(tok, "ya29.test-token\n");
  for (const model of ["claude-3-5-haiku@20241022", "gemini-2.5-flash"]) {
    await withTracing(async ({ recv, sc }) => {
      const c = new pgw.Client(sc.sock);
      try {
        const r = await c.call("chat", { model, max_tokens: 16, messages: [{ role: "user", content: PROMPT }] },
          { trace: { traceparent: TRACEPARENT } });
        assert.ok(r.source, JSON.stringify(r)); /* a's answer, or b's after it */
      } finally {
        c.close();
      }
      const isA = (x) => x.kind === SpanKind.SPAN_KIND_CLIENT && x.attrs["polygw.source"] === "a";
      const spans = await recv.waitFor((s) => s.some(isA));
      const attempt = spans.find(isA);
      assert.equal(attempt.attrs["gen_ai.provider.name"], "gcp.vertex_ai", model);
      assert.equal(attempt.attrs["gen_ai.system"], "gcp.vertex_ai");
      assert.equal(attempt.attrs["gen_ai.request.model"], model);
    }, "", `, breaker: {failures: 100000}, kind: vertex, project: p1, location: us-east5, model: "${model}", token_file: "${tok}"`,
    "chat", (text) => text.replace(", api_key_env: PGW_TRACE_KEY", ""));
  }
});
