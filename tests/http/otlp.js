// An OTLP/HTTP traces receiver for the tracing tests: it decodes what
// polygw sends with the OpenTelemetry project's own protobuf definitions
// (the generated root of @opentelemetry/otlp-transformer, built from
// opentelemetry-proto), never with polygw's encoder, and keeps every span
// with its raw request bytes. A receiver can also be told to answer 500 or
// 429, or never to answer.
import http from "node:http";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const root = require("@opentelemetry/otlp-transformer/build/src/generated/root.js");
const pb = root.opentelemetry.proto;
const Request = pb.collector.trace.v1.ExportTraceServiceRequest;

export const SpanKind = pb.trace.v1.Span.SpanKind;
export const StatusCode = pb.trace.v1.Status.StatusCode;

export const hex = (b) => Buffer.from(b || []).toString("hex");

/** An attribute list ([{key, value: AnyValue}]) as a plain object. */
export function attrs(list) {
  const out = {};
  for (const kv of list || []) {
    const v = kv.value || {};
    if (v.stringValue != null) out[kv.key] = v.stringValue;
    else if (v.intValue != null) out[kv.key] = Number(v.intValue);
    else if (v.doubleValue != null) out[kv.key] = v.doubleValue;
    else if (v.boolValue != null) out[kv.key] = v.boolValue;
  }
  return out;
}

const ns = (x) => Number(BigInt(x.toString()));

/** A decoded span in test-friendly form (ids as hex, times in ms). */
function simplify(s, resource) {
  return {
    traceId: hex(s.traceId),
    spanId: hex(s.spanId),
    parentSpanId: hex(s.parentSpanId),
    traceState: s.traceState || "",
    name: s.name,
    kind: s.kind,
    startMs: ns(s.startTimeUnixNano) / 1e6,
    endMs: ns(s.endTimeUnixNano) / 1e6,
    attrs: attrs(s.attributes),
    events: (s.events || []).map((e) => ({ name: e.name, timeMs: ns(e.timeUnixNano) / 1e6, attrs: attrs(e.attributes) })),
    links: (s.links || []).map((l) => ({ traceId: hex(l.traceId), spanId: hex(l.spanId) })),
    status: s.status || {},
    droppedEvents: s.droppedEventsCount || 0,
    flags: s.flags,
    resource,
  };
}

export class Receiver {
  /** mode: "ok" | "500" | "429" | "hang" (can be changed later). */
  static async start(mode = "ok") {
    const r = new Receiver();
    r.mode = mode;
    r.spans = [];
    r.bodies = [];
    r.requests = 0;
    r.contentTypes = new Set();
    r.headers = [];
    r.hung = [];
    r.server = http.createServer((req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        r.requests++;
        r.contentTypes.add(req.headers["content-type"]);
        r.headers.push(req.headers);
        if (r.mode === "hang") {
          r.hung.push(res);
          return;
        }
        if (r.mode === "500" || r.mode === "429") {
          res.writeHead(Number(r.mode), r.mode === "429" ? { "Retry-After": "1" } : {});
          res.end();
          return;
        }
        const body = Buffer.concat(chunks);
        r.bodies.push(body);
        const msg = Request.decode(body);
        for (const rs of msg.resourceSpans) {
          const resource = attrs(rs.resource?.attributes);
          for (const ss of rs.scopeSpans) for (const s of ss.spans) r.spans.push(simplify(s, resource));
        }
        res.writeHead(200, { "Content-Type": "application/x-protobuf" });
        res.end();
      });
    });
    await new Promise((resolve) => r.server.listen(0, "127.0.0.1", resolve));
    r.port = r.server.address().port;
    return r;
  }

  get url() {
    return `http://127.0.0.1:${this.port}/v1/traces`;
  }

  /** Resolves to the spans once pred(spans) holds; rejects after timeoutMs. */
  async waitFor(pred, timeoutMs = 10000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (pred(this.spans)) return this.spans;
      if (Date.now() > deadline) throw new Error(`spans never matched: ${JSON.stringify(this.spans, null, 1)}`);
      await new Promise((res) => setTimeout(res, 20));
    }
  }

  async stop() {
    for (const res of this.hung) res.destroy();
    this.server.closeAllConnections?.();
    await new Promise((resolve) => this.server.close(resolve));
  }
}
