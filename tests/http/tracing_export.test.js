// The trace exporter against receivers that are down, never answer, or
// answer 500 or 429: calls go on at their usual latency (the event loop is
// never blocked), the queue stays within max_queue_spans, memory stays
// flat, and every span that could not be delivered is counted.
import assert from "node:assert/strict";
import fs from "node:fs";
import test from "node:test";

import { Mock, Sidecar, freePort, sleep } from "../../client/node/test/helpers.js";
import { canConnect, metrics } from "./front.js";
import { Receiver } from "./otlp.js";

const QUEUE = 40;

function config(up, port, endpoint) {
  return [
    "listen:", '  mode: "0660"',
    "server:", "  log_level: warn", "  shutdown_grace_s: 0.5",
    "defaults: {max_attempts: 1, stall_window_s: 20}",
    "http:", `  listen: "127.0.0.1:${port}"`,
    "tracing:", "  enabled: true", `  endpoint: "${endpoint}"`,
    "  export_interval_s: 0.05", "  export_timeout_s: 0.5", "  max_retries: 1",
    `  max_queue_spans: ${QUEUE}`, "  max_batch_spans: 10",
    "sources:",
    `  - {name: a, capability: chat, base_url: "${up.url}", timeout_s: 20, ttft_timeout_s: 10, max_concurrency: 64, aimd: {initial: 64}}`,
    "",
  ].join("\n");
}

function sample(text, name) {
  const m = new RegExp(`^${name.replace(/[{}"=]/g, "\\$&")} (\\S+)$`, "m").exec(text);
  return m ? Number(m[1]) : NaN;
}

function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m[1]);
}

async function timedCall(port) {
  const t0 = performance.now();
  const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
  });
  await res.json();
  assert.equal(res.status, 200);
  return performance.now() - t0;
}

const p50 = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

for (const mode of ["down", "hang", "500", "429"]) {
  test(`a receiver that is ${mode === "down" ? "down" : mode === "hang" ? "slow (never answers)" : `answering ${mode}`}`, async () => {
    const up = await Mock.start();
    const recv = mode === "down" ? null : await Receiver.start(mode);
    const endpoint = recv ? recv.url : `http://127.0.0.1:${await freePort()}/v1/traces`;
    const port = await freePort();
    const sc = new Sidecar("");
    try {
      fs.writeFileSync(sc.configPath, config(up, port, endpoint));
      await sc.start();
      while (!(await canConnect(port))) await sleep(20);
      // Warm up, then the latency of calls made one after another while
      // the exporter fails; then a burst that overflows the queue.
      for (let i = 0; i < 5; i++) await timedCall(port);
      const lat = [];
      for (let i = 0; i < 40; i++) lat.push(await timedCall(port));
      const rss0 = rssKiB(sc.proc.pid);
      for (let round = 0; round < 10; round++)
        await Promise.all(Array.from({ length: 40 }, () => timedCall(port)));
      for (let i = 0; i < 20; i++) lat.push(await timedCall(port));
      const rss1 = rssKiB(sc.proc.pid);

      // A hung export request (timeout_s 0.5) never delays a call: were
      // the loop blocked, calls would take ~500 ms.
      assert.ok(Math.max(...lat) < 400, `latencies ${lat.map((x) => x.toFixed(1)).join(" ")}`);
      assert.ok(p50(lat) < 100, `p50 ${p50(lat)}`);
      // Memory bounded: 400 calls' spans did not pile up.
      assert.ok(rss1 - rss0 < 30 * 1024, `RSS grew ${rss1 - rss0} KiB`);

      // The batch out is dropped after its one retry (backoff 1 s, or the
      // 429's Retry-After: 1).
      let text = await metrics(port);
      for (let i = 0; i < 100 && !(sample(text, 'polygw_trace_spans_dropped_total{reason="export_failed"}') > 0); i++) {
        await sleep(50);
        text = await metrics(port);
      }
      const queued = sample(text, "polygw_trace_spans_queued");
      const full = sample(text, 'polygw_trace_spans_dropped_total{reason="queue_full"}');
      const failed = sample(text, 'polygw_trace_spans_dropped_total{reason="export_failed"}');
      const exportsFailed = sample(text, 'polygw_trace_exports_total{result="failed"}');
      const started = sample(text, "polygw_trace_spans_started_total");
      assert.ok(queued <= QUEUE, `queued ${queued}`);
      assert.ok(full > 0, "spans ended into a full queue are counted");
      assert.ok(exportsFailed > 0);
      assert.equal(sample(text, "polygw_trace_spans_exported_total"), 0);
      assert.ok(failed > 0, "undelivered batches are counted");
      // Every span is accounted for: queued, dropped, or in the one batch out.
      assert.ok(started - queued - full - failed <= 10, `started ${started} queued ${queued} full ${full} failed ${failed}`);
      if (mode === "429") assert.ok(sample(text, "polygw_trace_export_retries_total") > 0);
      if (recv) assert.ok(recv.requests > 0);
    } finally {
      try {
        await sc.finish();
      } finally {
        if (recv) await recv.stop();
        await up.stop();
      }
    }
  });
}
