// Passthrough capabilities (`body: raw`, docs/HTTP.md §1) driven by the
// official OpenAI Node SDK against the real sidecar: an audio transcription
// uploads a real file as multipart/form-data and the upstream receives the
// very bytes the SDK sent; text-to-speech answers binary audio that reaches
// the SDK byte for byte; files.list() is a GET with a query. The upstream
// is a small HTTP server in this file (the mock upstream speaks JSON).
import assert from "node:assert/strict";
import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { test } from "node:test";

import OpenAI from "openai";

import { Sidecar, sleep } from "../../client/node/test/helpers.js";

const SOURCE = "timeout_s: 20, connect_timeout_s: 5, ttft_timeout_s: 5, idle_timeout_s: 20";
// The speech answer: every byte value, CR LF and NULs among them.
const SPEECH = Buffer.concat([...Array(64)].map(() => Buffer.from([...Array(256).keys()])));

const sha256 = (b) => crypto.createHash("sha256").update(b).digest("hex");

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

/** The upstream: records each request (method, url, content type, body). */
function startUpstream() {
  const seen = [];
  const server = http.createServer((req, res) => {
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => {
      const body = Buffer.concat(parts);
      seen.push({ method: req.method, url: req.url, ctype: req.headers["content-type"], body });
      const url = req.url.split("?")[0];
      if (url === "/v1/audio/speech") {
        res.writeHead(200, { "Content-Type": "audio/mpeg", "Content-Length": SPEECH.length });
        res.end(SPEECH);
      } else if (url === "/v1/audio/transcriptions") {
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ text: sha256(body) }));
      } else if (url === "/v1/files" && req.method === "GET") {
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify({
          object: "list", has_more: false,
          data: [{ id: "file-1", object: "file", bytes: 3, created_at: 1, filename: req.url,
                   purpose: "batch" }],
        }));
      } else {
        res.writeHead(404, { "Content-Type": "application/json" });
        res.end('{"error":{"message":"no such path"}}');
      }
    });
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({
    seen, url: `http://127.0.0.1:${server.address().port}/v1`,
    stop: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  })));
}

/** Per test: the upstream, a sidecar serving three raw capabilities on TCP,
 * and an SDK client whose fetch keeps the exact bytes of each request body. */
async function withRaw(fn) {
  const up = await startUpstream();
  let sc;
  try {
    const port = await freePort();
    const u = JSON.stringify(up.url);
    sc = new Sidecar([
      "listen:", '  mode: "0660"',
      "server:", "  log_level: info", "  shutdown_grace_s: 0.5",
      "defaults: {max_attempts: 2, stall_window_s: 10, backoff_base_s: 0.05, backoff_max_s: 0.1}",
      "capabilities:",
      "  transcribe: {path: /audio/transcriptions, body: raw}",
      "  speech: {path: /audio/speech, body: raw}",
      "  files: {path: /files, body: raw, methods: [GET, POST, DELETE]}",
      "http:", `  listen: "127.0.0.1:${port}"`,
      "sources:",
      `  - {name: t, capability: transcribe, base_url: ${u}, ${SOURCE}}`,
      `  - {name: s, capability: speech, base_url: ${u}, ${SOURCE}}`,
      `  - {name: f, capability: files, base_url: ${u}, ${SOURCE}}`,
      "",
    ].join("\n"));
    await sc.start();
    while (!(await canConnect(port))) await sleep(20);
    const sent = [];
    // The body as it leaves the SDK: the multipart encoding made once, kept,
    // and sent as those bytes.
    const keeping = async (url, init) => {
      const req = new Request(url, init);
      const body = init?.body == null ? undefined : Buffer.from(await req.arrayBuffer());
      sent.push(body);
      return fetch(url, { method: req.method, headers: req.headers, body, signal: init?.signal });
    };
    const client = new OpenAI({ apiKey: "unused-by-polygw", baseURL: `http://127.0.0.1:${port}/v1`,
      maxRetries: 0, fetch: keeping });
    return await fn({ up, sc, client, sent });
  } finally {
    try {
      if (sc) await sc.finish();
    } finally {
      await up.stop();
    }
  }
}

test("audio.transcriptions.create: the multipart upload arrives byte for byte", () => withRaw(async (f) => {
  const file = path.join(f.sc.dir, "speech.wav");
  const audio = Buffer.concat([Buffer.from("RIFF"), crypto.randomBytes(48 * 1024), Buffer.from("\r\n--x\r\n")]);
  fs.writeFileSync(file, audio);
  const res = await f.client.audio.transcriptions.create({ file: fs.createReadStream(file), model: "whisper-1" });
  const got = f.up.seen.at(-1);
  assert.equal(got.method, "POST");
  assert.match(got.ctype, /^multipart\/form-data; boundary=/);
  assert.equal(sha256(got.body), sha256(f.sent.at(-1)));
  assert.equal(res.text, sha256(got.body));
  assert.ok(got.body.includes(audio), "the file's bytes are in the upload");
}));

test("audio.speech.create: the binary answer reaches the SDK byte for byte", () => withRaw(async (f) => {
  const res = await f.client.audio.speech.create({ model: "tts-1", voice: "alloy", input: "hello" });
  assert.equal(res.headers.get("content-type"), "audio/mpeg");
  assert.equal(res.headers.get("x-polygw-source"), "s");
  const bytes = Buffer.from(await res.arrayBuffer());
  assert.ok(bytes.equals(SPEECH));
  assert.equal(JSON.parse(f.up.seen.at(-1).body.toString()).input, "hello");
}));

test("files.list: a GET with its query through a raw capability", () => withRaw(async (f) => {
  const page = await f.client.files.list({ purpose: "batch" });
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].id, "file-1");
  assert.equal(f.up.seen.at(-1).method, "GET");
  assert.equal(f.up.seen.at(-1).url, "/v1/files?purpose=batch");
}));
