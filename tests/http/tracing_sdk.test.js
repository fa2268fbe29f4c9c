// An application instrumented with the OpenTelemetry Node SDK
// (@opentelemetry/sdk-trace-node, with undici's instrumentation for the
// fetch the official `openai` SDK uses) calls polygw's HTTP front: its
// fetch span's traceparent makes polygw's call span a child of it, so the
// app's span, its HTTP client span, polygw's call span and polygw's attempt
// span read as one trace. A stream is one attempt span with its first byte.
import assert from "node:assert/strict";
import fs from "node:fs";
import test from "node:test";

import { trace, SpanKind as ApiKind } from "@opentelemetry/api";
import { registerInstrumentations } from "@opentelemetry/instrumentation";
import { UndiciInstrumentation } from "@opentelemetry/instrumentation-undici";
import { InMemorySpanExporter, NodeTracerProvider, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-node";
import OpenAI from "openai";

import { Mock, Sidecar, freePort, sleep } from "../../client/node/test/helpers.js";
import { canConnect } from "./front.js";
import { Receiver, SpanKind } from "./otlp.js";

const appSpans = new InMemorySpanExporter();
const provider = new NodeTracerProvider();
provider.addSpanProcessor(new SimpleSpanProcessor(appSpans));
provider.register();
registerInstrumentations({ instrumentations: [new UndiciInstrumentation()] });
const tracer = trace.getTracer("agent-app");

test("the OpenAI SDK in an instrumented app: polygw's spans under the app's", async () => {
  const up = await Mock.start();
  const recv = await Receiver.start();
  const port = await freePort();
  const sc = new Sidecar("");
  try {
    fs.writeFileSync(sc.configPath, [
      "listen:", '  mode: "0660"',
      "server:", "  log_level: info", "  shutdown_grace_s: 0.5",
      "defaults: {max_attempts: 2, stall_window_s: 20}",
      "http:", `  listen: "127.0.0.1:${port}"`,
      "tracing:", "  enabled: true", `  endpoint: "${recv.url}"`, "  export_interval_s: 0.1",
      "sources:",
      `  - {name: a, capability: chat, base_url: "${up.url}", timeout_s: 20, ttft_timeout_s: 10}`,
      "",
    ].join("\n"));
    await sc.start();
    while (!(await canConnect(port))) await sleep(20);

    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0 });
    const runIds = await tracer.startActiveSpan("agent.run", async (run) => {
      const r = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] });
      assert.ok(r.choices[0].message.content);
      const stream = await client.chat.completions.create({
        model: "m", stream: true, messages: [{ role: "user", content: "hi" }],
      });
      let chunks = 0;
      for await (const _ of stream) chunks++;
      assert.ok(chunks > 0);
      run.end();
      return run.spanContext();
    });

    const app = appSpans.getFinishedSpans();
    const fetches = app.filter((s) => s.kind === ApiKind.CLIENT);
    assert.equal(fetches.length, 2, app.map((s) => s.name).join());
    for (const f of fetches) {
      assert.equal(f.spanContext().traceId, runIds.traceId);
      assert.equal(f.parentSpanId ?? f.parentSpanContext?.spanId, runIds.spanId);
    }
    const spans = await recv.waitFor((s) => s.length >= 4);
    assert.equal(spans.length, 4);
    for (const s of spans) assert.equal(s.traceId, runIds.traceId, "one trace");
    const calls = spans.filter((s) => s.kind === SpanKind.SPAN_KIND_SERVER);
    assert.equal(calls.length, 2);
    const fetchIds = new Set(fetches.map((f) => f.spanContext().spanId));
    for (const call of calls) {
      assert.ok(fetchIds.has(call.parentSpanId), "polygw's call span is the app's fetch span's child");
      const attempts = spans.filter((s) => s.parentSpanId === call.spanId);
      assert.equal(attempts.length, 1, "one attempt span per call, a stream's too");
      assert.equal(attempts[0].kind, SpanKind.SPAN_KIND_CLIENT);
      assert.ok(attempts[0].events.some((e) => e.name === "polygw.first_byte"));
      assert.equal(attempts[0].attrs["gen_ai.provider.name"], "openai");
    }
    assert.deepEqual(calls.map((c) => c.attrs["polygw.stream"]).sort(), [false, true]);
    // The app's own spans and polygw's never share an id.
    const ids = new Set(app.map((s) => s.spanContext().spanId));
    for (const s of spans) assert.ok(!ids.has(s.spanId));
  } finally {
    try {
      await sc.finish();
    } finally {
      await recv.stop();
      await up.stop();
    }
  }
});
