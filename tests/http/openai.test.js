// polygw's HTTP front end (docs/HTTP.md) driven by the official OpenAI Node
// SDK, against the real sidecar and the real mock upstream: chat,
// streaming chat, embeddings, over TCP and over the Unix socket (undici
// Agent with socketPath as the SDK's fetch dispatcher); the Responses API,
// its follow-ups and a background stream resumed; a typed error is an
// APIError carrying polygw's code after exactly one HTTP request; aborting
// a request closes the upstream connection.
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { test } from "node:test";

import OpenAI from "openai";
import { Agent, fetch as undiciFetch } from "undici";

import { Mock, Sidecar, sleep } from "../../client/node/test/helpers.js";

const SOURCE = "timeout_s: 20, connect_timeout_s: 5, ttft_timeout_s: 1, idle_timeout_s: 20, " +
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

function configText(upUrl, port, dir, extra = [], sources = null) {
  return [
    "listen:", '  mode: "0660"',
    "server:", "  log_level: info", "  shutdown_grace_s: 0.5",
    "defaults: {max_attempts: 2, stall_window_s: 1, backoff_base_s: 0.05, backoff_max_s: 0.1}",
    "http:", `  socket: ${JSON.stringify(path.join(dir, "http.sock"))}`, `  listen: "127.0.0.1:${port}"`,
    ...extra,
    "sources:",
    ...(sources ? sources(JSON.stringify(upUrl)) : [
      `  - {name: a, capability: chat, base_url: ${JSON.stringify(upUrl)}, ${SOURCE}}`,
      `  - {name: e, capability: embedding, base_url: ${JSON.stringify(upUrl)}, model: emb-1, serves: ["*"], ${SOURCE}}`,
      `  - {name: r, capability: responses, base_url: ${JSON.stringify(upUrl)}, ${SOURCE}}`,
    ]),
    "",
  ].join("\n");
}

async function canConnect(port) {
  return new Promise((resolve) => {
    const s = net.createConnection({ host: "127.0.0.1", port });
    s.once("connect", () => { s.destroy(); resolve(true); });
    s.once("error", () => resolve(false));
  });
}

/** Per test: a mock, a sidecar with its HTTP front on TCP and on a Unix
 * socket, and SDK clients for both; every fetch the SDKs make is counted. */
async function withFront(fn, setup = () => [], sources = null) {
  const up = await Mock.start();
  let sc;
  const agent = { closed: false };
  try {
    const port = await freePort();
    sc = new Sidecar("");
    fs.writeFileSync(sc.configPath, configText(up.url, port, sc.dir, setup(sc.dir), sources));
    await sc.start();
    while (!(await canConnect(port))) await sleep(20);
    const fetches = { n: 0 };
    const counting = (f) => (url, init) => { fetches.n++; return f(url, init); };
    const tcp = new OpenAI({ apiKey: "unused-by-polygw", baseURL: `http://127.0.0.1:${port}/v1`,
      maxRetries: 3, fetch: counting(globalThis.fetch) });
    agent.unix = new Agent({ connect: { socketPath: path.join(sc.dir, "http.sock") } });
    const unix = new OpenAI({ apiKey: "unused-by-polygw", baseURL: "http://polygw/v1", maxRetries: 3,
      fetch: counting(undiciFetch), fetchOptions: { dispatcher: agent.unix } });
    return await fn({ up, sc, tcp, unix, fetches, port });
  } finally {
    try {
      if (agent.unix) await agent.unix.close();
      if (sc) await sc.finish();
    } finally {
      await up.stop();
    }
  }
}

const chatBody = (text, mock, extra = {}) => ({
  model: "m", messages: [{ role: "user", content: text }], ...(mock ? { mock } : {}), ...extra,
});

for (const via of ["tcp", "unix"]) {
  test(`chat over ${via}`, () => withFront(async (f) => {
    const client = f[via];
    const { data, response } = await client.chat.completions
      .create(chatBody(`hello over ${via}`)).withResponse();
    assert.equal(data.choices[0].message.content, `hello over ${via}`);
    assert.ok(data.usage.total_tokens > 0);
    assert.equal(response.headers.get("x-polygw-source"), "a");
    assert.equal(response.headers.get("x-polygw-attempts"), "1");
    assert.equal(f.fetches.n, 1);
    assert.equal((await f.up.last()).json.messages[0].content, `hello over ${via}`);
  }));

  test(`streaming chat over ${via}: chunks arrive before the upstream finishes`, () => withFront(async (f) => {
    const t0 = Date.now();
    const stream = await f[via].chat.completions.create(
      chatBody("abcdefghijkl", { stream_events: 4, stream_interval_ms: 250 }, { stream: true }));
    const seen = [];
    for await (const chunk of stream) seen.push([Date.now() - t0, chunk]);
    const tEnd = Date.now() - t0;
    const text = seen.map(([, c]) => c.choices[0]?.delta?.content ?? "").join("");
    assert.equal(text, "abcdefghijkl");
    assert.ok(seen.length >= 5, `${seen.length} chunks`);
    // 4 content events and the finish, 250 ms apart: the first came ~1 s
    // before the end.
    assert.ok(seen[0][0] < tEnd - 700, `first chunk at ${seen[0][0]} ms, end at ${tEnd} ms`);
    assert.equal(seen.at(-1)[1].choices[0].finish_reason, "stop");
  }));

  test(`embeddings over ${via}`, () => withFront(async (f) => {
    const res = await f[via].embeddings.create({ model: "any", input: ["a", "b", "c"] });
    assert.equal(res.data.length, 3);
    assert.equal(res.data[0].embedding.length, 8);
    assert.equal((await f.up.last()).json.model, "emb-1");
  }));
}

/** polygw_source_tokens_total of source r (the responses capability). */
async function responsesTokens(port) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const line = text.split("\n")
    .find((l) => l.startsWith('polygw_source_tokens_total{source="r",capability="responses"} '));
  return line ? Number(line.split(" ").at(-1)) : null;
}

const responsesBody = (text, mock, extra = {}) => ({
  model: "m", input: [{ role: "user", content: text }], ...(mock ? { mock } : {}), ...extra,
});

test("responses.create, plain: the Responses object, usage counted", () => withFront(async (f) => {
  const res = await f.tcp.responses.create(
    responsesBody("plain response", { usage: { prompt_tokens: 120, completion_tokens: 7 } }));
  assert.equal(res.object, "response");
  assert.equal(res.status, "completed");
  assert.equal(res.output_text, "plain response");
  assert.equal(res.usage.total_tokens, 127);
  assert.equal((await f.up.last()).path, "/v1/responses");
  assert.equal(await responsesTokens(f.port), 127);
}));

test("responses.create, streamed: events iterate to response.completed, no error", () => withFront(async (f) => {
  const stream = await f.unix.responses.create(responsesBody("streamed words",
    { stream_events: 3, usage: { prompt_tokens: 50, completion_tokens: 5 } }, { stream: true }));
  const types = [];
  let text = "";
  let last;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    last = ev;
  }
  assert.equal(types[0], "response.created");
  assert.equal(types.at(-1), "response.completed");
  assert.ok(!types.includes("error"), types.join(","));
  assert.equal(types.filter((t) => t === "response.output_text.delta").length, 3);
  assert.equal(text, "streamed words");
  assert.equal(last.response.usage.total_tokens, 55);
  assert.equal((await f.up.last()).json.stream_options, undefined);
  assert.equal(await responsesTokens(f.port), 55);
}));

test("responses follow-ups reach the source that made the response, of two serving the model",
  async () => {
    const up2 = await Mock.start();
    try {
      await withFront(async (f) => {
        const mocks = { [f.up.proc.pid]: f.up, [up2.proc.pid]: up2 };
        const makerOf = (id) => mocks[Number(id.split("_")[2])];
        // One response made on each mock: the mock that made the last one
        // fails its next request, so the call fails over to the other.
        const made = new Map();
        for (let i = 0; i < 6 && made.size < 2; i++) {
          const res = i % 2 === 0
            ? await f.tcp.responses.create(responsesBody("first"))
            : await (async () => {
              let created;
              const stream = await f.unix.responses.create(responsesBody("first",
                { stream_events: 2 }, { stream: true }));
              for await (const ev of stream) if (ev.type === "response.created") created = ev.response;
              return created;
            })();
          const maker = makerOf(res.id);
          assert.ok(maker, res.id);
          if (!made.has(maker)) made.set(maker, res.id);
          await maker.control("POST", "/_mock/script", [{ status: 503 }]);
        }
        await f.up.control("POST", "/_mock/script", []);
        await up2.control("POST", "/_mock/script", []);
        assert.equal(made.size, 2);
        for (const [maker, id] of made) {
          const other = maker === f.up ? up2 : f.up;
          const otherBefore = (await other.stats()).requests;
          const next = await f.tcp.responses.create(responsesBody("next", null,
            { previous_response_id: id }));
          assert.equal(next.status, "completed");
          assert.equal((await maker.last()).json.previous_response_id, id);
          const streamed = await f.unix.responses.create(responsesBody("streamed", { stream_events: 2 },
            { previous_response_id: id, stream: true }));
          const types = [];
          for await (const ev of streamed) types.push(ev.type);
          assert.equal(types.at(-1), "response.completed");
          assert.equal((await maker.last()).json.previous_response_id, id);
          const got = await f.tcp.responses.retrieve(id);
          assert.equal(got.id, id);
          assert.equal((await maker.last()).path, `/v1/responses/${id}`);
          const items = await f.tcp.responses.inputItems.list(id);
          assert.equal(items.data[0].id, "msg_in_1");
          const cancelled = await f.tcp.responses.cancel(id);
          assert.equal(cancelled.status, "cancelled");
          await f.tcp.responses.delete(id);
          assert.equal((await maker.last()).method, "DELETE");
          assert.equal((await other.stats()).requests, otherBefore);
        }
        // An id no source is known to have made, with two that could have.
        await assert.rejects(f.tcp.responses.create(responsesBody("x", null,
          { previous_response_id: "resp_never_made" })), (e) => {
          assert.ok(e instanceof OpenAI.NotFoundError, e);
          assert.equal(e.code, "response_not_found");
          return true;
        });
        assert.ok(await responsesTokens(f.port) > 0);
      }, () => [], (url) => [
        `  - {name: r, capability: responses, base_url: ${url}, ${SOURCE}}`,
        `  - {name: r2, capability: responses, base_url: ${JSON.stringify(up2.url)}, ${SOURCE}}`,
      ]);
    } finally {
      await up2.stop();
    }
  });

test("responses.retrieve(id, {stream: true}) resumes a stream event by event; a cut one rejects",
  () => withFront(async (f) => {
    const id = "resp_background_1";
    await f.tcp.responses.create(responsesBody("counted",
      { usage: { prompt_tokens: 120, completion_tokens: 7 } }));
    assert.equal(await responsesTokens(f.port), 127);
    await f.up.control("POST", "/_mock/script", [{ stream_events: 3, stream_interval_ms: 250,
      usage: { prompt_tokens: 100, completion_tokens: 9 } }]);
    const t0 = Date.now();
    const stream = await f.tcp.responses.retrieve(id, { stream: true, starting_after: 1 });
    const seen = [];
    for await (const ev of stream) seen.push([Date.now() - t0, ev]);
    const tEnd = Date.now() - t0;
    const types = seen.map(([, ev]) => ev.type);
    // sequence_number 0 and 1 (created, in_progress) were before starting_after.
    assert.equal(seen[0][1].sequence_number, 2);
    assert.equal(types[0], "response.output_item.added");
    assert.equal(types.at(-1), "response.completed");
    assert.ok(!types.includes("error"), types.join(","));
    assert.equal(seen.at(-1)[1].response.id, id);
    assert.equal(seen.at(-1)[1].response.usage.total_tokens, 109);
    assert.equal(seen.map(([, ev]) => ev.delta ?? "").join(""), "mock reply");
    // Three deltas and the closing events, 250 ms apart: the first event
    // came ~750 ms before the end, and each delta on its own.
    assert.ok(seen[0][0] < tEnd - 500, `first event at ${seen[0][0]} ms, end at ${tEnd} ms`);
    const deltas = seen.filter(([, ev]) => ev.type === "response.output_text.delta").map(([t]) => t);
    for (let i = 1; i < deltas.length; i++)
      assert.ok(deltas[i] - deltas[i - 1] >= 150, `deltas at ${deltas.join(", ")} ms`);
    const last = await f.up.last();
    assert.equal(last.method, "GET");
    assert.equal(last.path, `/v1/responses/${id}`);
    assert.deepEqual(new URLSearchParams(last.target.split("?")[1]).get("starting_after"), "1");
    assert.deepEqual(new URLSearchParams(last.target.split("?")[1]).get("stream"), "true");
    // The resumed response's usage was its original call's to count.
    assert.equal(await responsesTokens(f.port), 127);

    await f.up.control("POST", "/_mock/script", [{ stream_events: 2, no_done: true }]);
    const cut = await f.unix.responses.retrieve(id, { stream: true });
    const got = [];
    await assert.rejects((async () => { for await (const ev of cut) got.push(ev.type); })(), (e) => {
      assert.ok(e instanceof OpenAI.APIError, e);
      assert.equal(e.code, "stream_interrupted");
      return true;
    });
    assert.equal(got[0], "response.created");
    assert.ok(!got.includes("response.completed"), got.join(","));
  }));

test("a typed error is an APIError with polygw's code, after one HTTP request", () => withFront(async (f) => {
  await f.up.control("POST", "/_mock/script", { default: { status: 500 } });
  await assert.rejects(f.tcp.embeddings.create({ model: "x", input: "a" }), (e) => {
    assert.ok(e instanceof OpenAI.APIError, e);
    assert.equal(e.status, 503);
    assert.equal(e.code, "retry_exhausted");
    assert.equal(e.headers.get("x-should-retry"), "false");
    assert.equal(e.error.polygw.attempts, 2);
    return true;
  });
  // maxRetries is 3, yet the SDK sent one request (x-should-retry: false);
  // polygw made its own two attempts upstream.
  assert.equal(f.fetches.n, 1);
  assert.equal((await f.up.stats()).requests, 2);

  f.fetches.n = 0;
  await assert.rejects(f.unix.chat.completions.create(chatBody("x", { delay_ms: 3000 }),
    { headers: { "X-Polygw-Deadline": "0.3" } }), (e) => {
    assert.ok(e instanceof OpenAI.APIError);
    assert.equal(e.status, 504);
    assert.equal(e.code, "deadline_exceeded");
    return true;
  });
  assert.equal(f.fetches.n, 1);
}));

test("stalled on a saturated upstream: APIError 503 stalled, one request", () => withFront(async (f) => {
  await f.up.control("POST", "/_mock/script", { default: { status: 429, retry_after: 0 } });
  await assert.rejects(f.tcp.chat.completions.create(chatBody("x")), (e) => {
    assert.equal(e.status, 503);
    assert.equal(e.code, "stalled");
    assert.ok(Number(e.headers.get("retry-after")) >= 1);
    return true;
  });
  assert.equal(f.fetches.n, 1);
}));

test("a stream failing after its first event throws the error event's APIError", () => withFront(async (f) => {
  const stream = await f.tcp.chat.completions.create(chatBody("a b c d",
    { stream_events: 4, stream_interval_ms: 50, close_after_bytes: 500 }, { stream: true }));
  let chunks = 0;
  await assert.rejects((async () => { for await (const _ of stream) chunks++; })(), (e) => {
    assert.ok(e instanceof OpenAI.APIError, e);
    assert.equal(e.code, "stream_interrupted");
    return true;
  });
  assert.ok(chunks >= 1);
}));

for (const via of ["tcp", "unix"]) {
  test(`a client abort over ${via} closes the upstream connection`, () => withFront(async (f) => {
    const ac = new AbortController();
    const p = f[via].chat.completions.create(chatBody("x", { hang: "before_headers" }), { signal: ac.signal });
    await f.up.waitStats((s) => s.in_progress === 1, 5000);
    const t0 = Date.now();
    ac.abort();
    await assert.rejects(p, (e) => e instanceof OpenAI.APIUserAbortError);
    await f.up.waitStats((s) => s.aborted_by_peer === 1 && s.open_connections === 0, 2000);
    assert.ok(Date.now() - t0 < 1000);
    assert.equal(f.fetches.n, 1);
  }));
}

test("a streaming abort closes the upstream connection", () => withFront(async (f) => {
  const stream = await f.tcp.chat.completions.create(chatBody("x",
    { stream_events: 1000, stream_interval_ms: 50 }, { stream: true }));
  let n = 0;
  for await (const _ of stream) {
    if (++n === 3) break; // leaving the loop aborts the request
  }
  await f.up.waitStats((s) => s.aborted_by_peer === 1 && s.open_connections === 0, 2000);
}));

test("abandoning a resumed Responses stream closes the upstream connection", () => withFront(async (f) => {
  await f.up.control("POST", "/_mock/script", [{ stream_events: 1000, stream_interval_ms: 50 }]);
  const stream = await f.tcp.responses.retrieve("resp_background_2", { stream: true });
  let n = 0;
  for await (const _ of stream) {
    if (++n === 6) break; // leaving the loop aborts the request
  }
  await f.up.waitStats((s) => s.aborted_by_peer === 1 && s.open_connections === 0, 2000);
}));

test("models lists the configured sources' models", () => withFront(async (f) => {
  const page = await f.unix.models.list();
  assert.deepEqual(page.data.map((m) => m.id), ["emb-1"]);
}));

// Model routing (docs/HTTP.md): the model asked for selects its sources.
test("models.list lists each model; each answers from its own source; an unknown one is a 404 after one request", () => withFront(async (f) => {
  const page = await f.tcp.models.list();
  assert.deepEqual(page.data.map((m) => [m.id, m.capability]),
    [["model-alpha", "chat"], ["model-beta", "chat"]]);
  for (const [model, source] of [["model-alpha", "alpha"], ["model-beta", "beta"]]) {
    const { data, response } = await f.tcp.chat.completions
      .create(chatBody(`ask ${model}`, undefined, { model })).withResponse();
    assert.equal(data.choices[0].message.content, `ask ${model}`);
    assert.equal(response.headers.get("x-polygw-source"), source);
    assert.equal((await f.up.last()).json.model, model);
  }
  const before = f.fetches.n, upstream = (await f.up.stats()).requests;
  await assert.rejects(f.tcp.chat.completions.create(chatBody("x", undefined, { model: "model-gamma" })), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    assert.equal(e.status, 404);
    assert.equal(e.code, "model_not_found");
    return true;
  });
  assert.equal(f.fetches.n - before, 1); // the SDK (maxRetries: 3) does not retry a 404
  assert.equal((await f.up.stats()).requests, upstream); // nothing went upstream
}, () => [], (url) => [
  `  - {name: alpha, capability: chat, base_url: ${url}, model: model-alpha, ${SOURCE}}`,
  `  - {name: beta, capability: chat, base_url: ${url}, model: model-beta, ${SOURCE}}`,
]));

test("X-Polygw-SDK-Retry: true lets the SDK retry what is worth retrying", () => withFront(async (f) => {
  await f.up.control("POST", "/_mock/script", { default: { status: 500 } });
  const retrying = new OpenAI({ apiKey: "unused-by-polygw", baseURL: `http://127.0.0.1:${f.port}/v1`,
    maxRetries: 1, defaultHeaders: { "X-Polygw-SDK-Retry": "true" },
    fetch: (url, init) => { f.fetches.n++; return globalThis.fetch(url, init); } });
  await assert.rejects(retrying.embeddings.create({ model: "x", input: "a" }), (e) => {
    assert.equal(e.code, "retry_exhausted");
    return true;
  });
  assert.equal(f.fetches.n, 2); // the first request and the SDK's one retry
  assert.equal((await f.up.stats()).requests, 4);
}));

// docs/APPS.md, "Over HTTP": an app's token is the SDK's apiKey over TCP.
const TOKEN = "tok-openai-sdk-2f9c41d7e0b3";
const tokenApp = (dir) => {
  fs.writeFileSync(path.join(dir, "app.token"), `${TOKEN}\n`);
  return ["apps:", `  - {name: sdk-app, token_file: ${JSON.stringify(path.join(dir, "app.token"))}}`];
};

test("an app token as the SDK's apiKey names the app; another key is an AuthenticationError", () => withFront(async (f) => {
  const app = new OpenAI({ apiKey: TOKEN, baseURL: `http://127.0.0.1:${f.port}/v1`, maxRetries: 3 });
  const data = await app.chat.completions.create(chatBody("as sdk-app"));
  assert.equal(data.choices[0].message.content, "as sdk-app");
  const line = f.sc.logs().split("\n").filter((l) => l.includes('"msg":"call"')).at(-1);
  assert.equal(JSON.parse(line).app, "sdk-app");
  // the upstream never sees the client's key
  assert.equal((await f.up.last()).headers.authorization, undefined);

  await assert.rejects(f.tcp.chat.completions.create(chatBody("x")), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError, e);
    assert.equal(e.status, 401);
    assert.equal(e.error.type, "authentication_error");
    return true;
  });
  assert.equal(f.fetches.n, 1); // not retried
  assert.equal((await f.up.stats()).requests, 1);
  // the Unix socket goes by the caller's uid: any key is fine there
  const r = await f.unix.chat.completions.create(chatBody("over unix"));
  assert.equal(r.choices[0].message.content, "over unix");
  assert.ok(!f.sc.logs().includes(TOKEN));
}, tokenApp));
