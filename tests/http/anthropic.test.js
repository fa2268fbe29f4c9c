// polygw's HTTP front end (docs/HTTP.md) driven, unmodified, by the
// official Anthropic TypeScript SDK: a `chat` capability whose source is
// kind: anthropic is served at POST /v1/messages, so the SDK pointed at
// polygw gets a plain and a streamed message exactly as from Anthropic,
// and a typed polygw error as its APIError after exactly one HTTP request.
// The mock upstream speaks the Messages API and checks the x-api-key and
// anthropic-version headers polygw sends it (its own key, not the SDK's).
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import { test } from "node:test";

import Anthropic from "@anthropic-ai/sdk";

import { Mock, Sidecar, sleep } from "../../client/node/test/helpers.js";

const KEY = "sk-ant-polygw-test-0123456789";
const SOURCE = "timeout_s: 20, connect_timeout_s: 5, ttft_timeout_s: 5, idle_timeout_s: 20, " +
  "max_concurrency: 64, aimd: {initial: 64}, breaker: {failures: 100000}";

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function canConnect(port) {
  return new Promise((resolve) => {
    const s = net.createConnection({ host: "127.0.0.1", port });
    s.once("connect", () => { s.destroy(); resolve(true); });
    s.once("error", () => resolve(false));
  });
}

function configText(upUrl, port) {
  return [
    "listen:", '  mode: "0660"',
    "server:", "  log_level: info", "  shutdown_grace_s: 0.5",
    "defaults: {max_attempts: 2, stall_window_s: 5, backoff_base_s: 0.05, backoff_max_s: 0.1}",
    "http:", `  listen: "127.0.0.1:${port}"`,
    "sources:",
    `  - {name: claude, capability: chat, kind: anthropic, base_url: ${JSON.stringify(upUrl)}, ` +
      `api_key_env: POLYGW_TEST_ANTHROPIC_KEY, ${SOURCE}}`,
    "",
  ].join("\n");
}

/** Per test: a mock that requires polygw's Anthropic key, a sidecar with
 * its HTTP front on TCP, and an SDK client whose fetches are counted. */
async function withFront(fn) {
  const up = await Mock.start();
  let sc;
  const saved = process.env.POLYGW_TEST_ANTHROPIC_KEY;
  try {
    await up.control("POST", "/_mock/script", { auth: { dialect: "anthropic", key: KEY } });
    const port = await freePort();
    process.env.POLYGW_TEST_ANTHROPIC_KEY = KEY; // the sidecar inherits it
    sc = new Sidecar("");
    fs.writeFileSync(sc.configPath, configText(up.url, port));
    await sc.start();
    while (!(await canConnect(port))) await sleep(20);
    const fetches = { n: 0 };
    const client = new Anthropic({
      apiKey: "the-sdk-key-polygw-never-forwards", baseURL: `http://127.0.0.1:${port}`,
      maxRetries: 3, fetch: (url, init) => { fetches.n++; return globalThis.fetch(url, init); },
    });
    return await fn({ up, sc, client, fetches });
  } finally {
    if (saved === undefined) delete process.env.POLYGW_TEST_ANTHROPIC_KEY;
    else process.env.POLYGW_TEST_ANTHROPIC_KEY = saved;
    try {
      if (sc) await sc.finish();
    } finally {
      await up.stop();
    }
  }
}

const body = (text, mock, extra = {}) => ({
  model: "claude-test", max_tokens: 64, messages: [{ role: "user", content: text }],
  ...(mock ? { mock } : {}), ...extra,
});

test("a plain message through polygw", () => withFront(async (f) => {
  const msg = await f.client.messages.create(body("hello claude",
    { usage: { prompt_tokens: 12, completion_tokens: 3 } }));
  assert.equal(msg.type, "message");
  assert.equal(msg.role, "assistant");
  assert.equal(msg.content[0].type, "text");
  assert.equal(msg.content[0].text, "hello claude");
  assert.equal(msg.stop_reason, "end_turn");
  assert.deepEqual(msg.usage, { input_tokens: 12, output_tokens: 3 });
  assert.equal(f.fetches.n, 1);
  const last = await f.up.last();
  assert.equal(last.path, "/v1/messages");
  assert.equal(last.headers["x-api-key"], KEY);
  assert.equal(last.headers["anthropic-version"], "2023-06-01");
}));

test("a streamed message: events arrive as the upstream produces them", () => withFront(async (f) => {
  const t0 = Date.now();
  const stream = f.client.messages.stream(body("abcdefghijkl",
    { stream_events: 4, stream_interval_ms: 250, usage: { prompt_tokens: 30, completion_tokens: 6 } }));
  const seen = [];
  let text = "";
  stream.on("text", (delta) => { text += delta; });
  for await (const ev of stream) seen.push([Date.now() - t0, ev.type]);
  const final = await stream.finalMessage();
  const tEnd = Date.now() - t0;
  assert.equal(text, "abcdefghijkl");
  assert.equal(final.content[0].text, "abcdefghijkl");
  assert.equal(final.stop_reason, "end_turn");
  assert.equal(final.usage.output_tokens, 6);
  const types = seen.map(([, t]) => t);
  assert.equal(types[0], "message_start");
  assert.equal(types.at(-1), "message_stop");
  assert.ok(types.includes("message_delta") && types.includes("content_block_delta"));
  // 4 deltas then the end, 250 ms apart: the first event came ~1 s early.
  assert.ok(seen[0][0] < tEnd - 700, `first event at ${seen[0][0]} ms, end at ${tEnd} ms`);
  assert.equal(f.fetches.n, 1);
}));

test("a typed polygw error is the SDK's APIError after one HTTP request", () => withFront(async (f) => {
  await f.up.control("POST", "/_mock/script", { default: { status: 529 } });
  await assert.rejects(f.client.messages.create(body("x")), (e) => {
    assert.ok(e instanceof Anthropic.APIError, e);
    assert.equal(e.status, 503);
    assert.equal(e.headers.get("x-should-retry"), "false");
    assert.match(JSON.stringify(e.error), /retry_exhausted/);
    return true;
  });
  // maxRetries is 3, yet the SDK sent one request; polygw made its own two
  // attempts upstream (529 overloaded is transient).
  assert.equal(f.fetches.n, 1);
  assert.equal((await f.up.stats()).requests, 2);
}));
