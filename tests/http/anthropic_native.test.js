// Anthropic's native endpoints beside /v1/messages (docs/HTTP.md,
// "Anthropic token counting"), driven by the official Anthropic SDK:
// messages.countTokens (also with ?beta=true, as Claude Code calls it)
// reaches a `count_tokens` capability of its own, with its own source and
// limits, never the chat capability; messages.stream
// through polygw; and, with a raw HTTP client, the `event:` lines of a
// Messages stream reach the client byte for byte as the mock sent them.
import assert from "node:assert/strict";
import http from "node:http";
import { test } from "node:test";

import Anthropic from "@anthropic-ai/sdk";

import { SOURCE, configHead, metrics, withFront as front } from "./front.js";

const KEY = "sk-ant-native-test-0123456789";

function configText(up, port) {
  const src = (name, cap, extra = "") => `  - {name: ${name}, capability: ${cap}, kind: anthropic, ` +
    `base_url: ${JSON.stringify(up.url)}, api_key_env: POLYGW_TEST_ANTHROPIC_KEY, ${SOURCE}${extra}}`;
  return [
    ...configHead(port),
    "capabilities:", "  count_tokens: {path: /messages/count_tokens}",
    "sources:", src("claude", "chat"), src("claude-count", "count_tokens", ", limits: {rpm: 600}"),
    "",
  ].join("\n");
}

const withFront = (fn) => front(
  { dialect: "anthropic", key: KEY, keyEnv: "POLYGW_TEST_ANTHROPIC_KEY", config: configText },
  (f) => fn({
    ...f,
    client: new Anthropic({
      apiKey: "the-sdk-key-polygw-never-forwards", baseURL: `http://127.0.0.1:${f.port}`,
      maxRetries: 0,
    }),
  }));

/** POST `body` to http://127.0.0.1:port`path`: {status, text}. */
function post(port, path, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const data = Buffer.from(JSON.stringify(body));
    const req = http.request({
      host: "127.0.0.1", port, path, method: "POST",
      headers: { "content-type": "application/json", "content-length": data.length, ...headers },
    }, (res) => {
      const parts = [];
      res.on("data", (d) => parts.push(d));
      res.on("end", () => resolve({ status: res.statusCode, text: Buffer.concat(parts).toString("latin1") }));
    });
    req.on("error", reject);
    req.end(data);
  });
}

const body = (text, mock, extra = {}) => ({
  model: "claude-test", max_tokens: 64, messages: [{ role: "user", content: text }],
  ...(mock ? { mock } : {}), ...extra,
});

const callsOf = (text, cap) => text.split("\n")
  .filter((l) => l.startsWith("polygw_calls_total{") && l.includes(`capability="${cap}"`))
  .reduce((n, l) => n + Number(l.split(" ").at(-1)), 0);

test("messages.countTokens reaches the count_tokens capability, not chat", () => withFront(async (f) => {
  const r = await f.client.messages.countTokens({
    model: "claude-test", messages: [{ role: "user", content: "count these" }],
    mock: { usage: { prompt_tokens: 17 } },
  });
  assert.deepEqual(r, { input_tokens: 17 });
  let last = await f.up.last();
  assert.equal(last.path, "/v1/messages/count_tokens");
  assert.equal(last.headers["x-api-key"], KEY);
  // With ?beta=true, as Claude Code calls it: the query goes on upstream.
  const b = await f.client.messages.countTokens({
    model: "claude-test", messages: [{ role: "user", content: "again" }],
    mock: { usage: { prompt_tokens: 5 } },
  }, { query: { beta: "true" } });
  assert.equal(b.input_tokens, 5);
  last = await f.up.last();
  assert.equal(last.target, "/v1/messages/count_tokens?beta=true");
  const m = await metrics(f.port);
  assert.equal(callsOf(m, "count_tokens"), 2);
  assert.equal(callsOf(m, "chat"), 0);
}));

test("messages.stream through polygw", () => withFront(async (f) => {
  const stream = f.client.messages.stream(body("native stream",
    { usage: { prompt_tokens: 9, completion_tokens: 4 } }));
  let text = "";
  stream.on("text", (d) => { text += d; });
  const final = await stream.finalMessage();
  assert.equal(text, "native stream");
  assert.equal(final.stop_reason, "end_turn");
  assert.equal(final.usage.output_tokens, 4);
  const m = await metrics(f.port);
  assert.equal(callsOf(m, "chat"), 1);
}));

test("a Messages stream's event: lines reach the client byte for byte", () => withFront(async (f) => {
  const b = body("byte for byte", undefined, { stream: true });
  const headers = { "x-api-key": KEY, "anthropic-version": "2023-06-01" };
  const direct = await post(f.up.port, "/v1/messages", b, headers);
  const relayed = await post(f.port, "/v1/messages?beta=true", b);
  assert.equal(direct.status, 200);
  assert.equal(relayed.status, 200);
  const events = (t) => t.split(/\r?\n/).filter((l) => l.startsWith("event:"));
  assert.ok(events(direct.text).length >= 5, direct.text);
  assert.deepEqual(events(relayed.text), events(direct.text));
  assert.equal((await f.up.last()).target, "/v1/messages?beta=true");
}));

test("the client's anthropic-beta header reaches an Anthropic source", () => withFront(async (f) => {
  // client.beta.* sends the betas in the anthropic-beta header, as Claude
  // Code does: polygw passes them on beside its own key and version.
  const betas = ["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"];
  const r = await f.client.beta.messages.countTokens({
    model: "claude-test", messages: [{ role: "user", content: "count" }], betas,
    mock: { usage: { prompt_tokens: 3 } },
  });
  assert.equal(r.input_tokens, 3);
  let last = await f.up.last();
  assert.equal(last.path, "/v1/messages/count_tokens");
  // (the SDK adds a beta of its own for countTokens)
  const sent = last.headers["anthropic-beta"].split(",");
  for (const b of betas) assert.ok(sent.includes(b), last.headers["anthropic-beta"]);
  assert.equal(last.headers["x-api-key"], KEY);
  const stream = f.client.beta.messages.stream({ ...body("beta stream"), betas: [betas[1]] });
  let text = "";
  stream.on("text", (d) => { text += d; });
  await stream.finalMessage();
  assert.equal(text, "beta stream");
  last = await f.up.last();
  assert.equal(last.headers["anthropic-beta"], betas[1]);
  // Without it, none is sent; a value that is not a list of names is 400.
  await f.client.messages.create(body("no beta"));
  assert.equal((await f.up.last()).headers["anthropic-beta"], undefined);
  const bad = await post(f.port, "/v1/messages", body("x"), { "anthropic-beta": "a\tb;c=d" });
  assert.equal(bad.status, 400, bad.text);
  assert.match(JSON.parse(bad.text).error.message, /anthropic-beta/);
}));
