// Pages of other origins against the HTTP front (docs/HTTP.md section 8), in a
// real browser: Debian's headless Chromium driven by puppeteer-core, against
// the real sidecar and the real mock upstream. A page served by a small
// server of this test on another loopback port — another origin, as any web
// page the user has open would be — calls the front every way a page can
// without a CORS grant (fetch with and without a preflight, no-cors, a
// beacon, a form, a sandboxed frame whose origin is "null") and tries to stop
// a running task: none of it reaches the upstream, the task still runs, and
// the front answered each with a refusal. The same page read from a name
// that resolves to the front's address (DNS rebinding) is refused too. A page
// of an origin listed in http.allowed_origins calls the front and reads the
// answer.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import { test } from "node:test";

import { Mock, Sidecar, freePort, sleep } from "../../client/node/test/helpers.js";
import { SOURCE_KEYS, frontConfig, launchChromium, waitHttp } from "./browser.js";

function configText(upUrl, port, dir, allowed) {
  return frontConfig(dir, port, {
    http: [`  allowed_origins: [${JSON.stringify(allowed)}]`],
    sources: [`  - {name: a, capability: chat, base_url: ${JSON.stringify(upUrl)}, ${SOURCE_KEYS}}`],
  });
}

/** A server of one blank page, on 127.0.0.1:port. */
async function pageServer() {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    res.end("<!doctype html><html><body><form id=f></form></body></html>");
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

async function httpStats(base) {
  return (await (await fetch(`${base}/polygw/v1/stats`)).json()).http;
}

// Every way the page tries, run in the page. Each entry: what the page saw.
async function attack(front) {
  const call = `${front}/v1/chat/completions`;
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "from a page" }] });
  const seen = {};
  const tryit = async (name, fn) => {
    try { seen[name] = await fn(); } catch (e) { seen[name] = `rejected: ${e.name}`; }
  };
  // A simple request: no preflight, the body as text/plain.
  await tryit("fetch text/plain", async () => (await fetch(call, { method: "POST", body })).status);
  await tryit("fetch no-cors", async () => (await fetch(call, { method: "POST", mode: "no-cors", body })).type);
  await tryit("fetch no-cors, no body", async () =>
    (await fetch(`${front}/polygw/v1/tasks/job-1/stop`, { method: "POST", mode: "no-cors" })).type);
  // A JSON request: the browser sends its preflight first.
  await tryit("fetch json", async () => (await fetch(call, {
    method: "POST", headers: { "Content-Type": "application/json" }, body })).status);
  await tryit("beacon", async () => navigator.sendBeacon(call, body));
  // A form posted into a frame of the page.
  await tryit("form", async () => {
    const frame = document.createElement("iframe");
    frame.name = "sink";
    document.body.appendChild(frame);
    const form = document.getElementById("f");
    form.method = "POST";
    form.enctype = "text/plain";
    form.action = `${front}/polygw/v1/tasks/job-1/stop`;
    form.target = "sink";
    const input = document.createElement("input");
    input.name = '{"reason":"from a page","x":"';
    input.value = '"}';
    form.appendChild(input);
    const loaded = new Promise((r) => { frame.onload = r; });
    form.submit();
    await loaded;
    return "submitted";
  });
  // A sandboxed frame: its requests say Origin: null.
  await tryit("sandboxed frame", async () => {
    const frame = document.createElement("iframe");
    frame.sandbox = "allow-scripts";
    frame.srcdoc = `<script>fetch(${JSON.stringify(call)}, {method: "POST", mode: "no-cors",
      body: ${JSON.stringify(body)}}).then(() => parent.postMessage("sent", "*"),
      () => parent.postMessage("failed", "*"));<\/script>`;
    const done = new Promise((r) => { window.onmessage = (ev) => r(ev.data); });
    document.body.appendChild(frame);
    return await done;
  });
  return seen;
}

test("pages of other origins cannot call the front; an allowed origin can", { timeout: 120000 }, async () => {
  const up = await Mock.start();
  let sc, browser, evil, friend;
  try {
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    evil = await pageServer();
    friend = await pageServer();
    const evilOrigin = `http://127.0.0.1:${evil.address().port}`;
    const friendOrigin = `http://localhost:${friend.address().port}`;
    sc = new Sidecar("");
    fs.writeFileSync(sc.configPath, configText(up.url, port, sc.dir, friendOrigin));
    await sc.start();
    await waitHttp(base);

    // A running task the pages try to stop.
    const start = await fetch(`${base}/polygw/v1/tasks/job-1/start`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
    assert.equal(start.status, 200);

    // evil.test resolves to the front's address (DNS rebinding).
    browser = await launchChromium(["--host-resolver-rules=MAP evil.test 127.0.0.1"]);
    const page = await browser.newPage();
    const answers = [];
    page.on("response", (r) => {
      if (r.url().startsWith(`${base}/`)) answers.push(`${r.request().method()} ${r.status()}`);
    });
    const before = await httpStats(base);
    const upBefore = (await up.stats()).requests;

    await page.goto(`${evilOrigin}/`, { waitUntil: "load" });
    const seen = await page.evaluate(attack, base);
    console.log(`# the page of ${evilOrigin} saw: ${JSON.stringify(seen)}`);
    // What the page can tell: the JSON call never got past its preflight.
    assert.equal(seen["fetch json"], "rejected: TypeError");
    assert.equal(seen["fetch text/plain"], "rejected: TypeError");
    assert.equal(seen["sandboxed frame"], "sent");

    // The front refused every one of them (a beacon is sent after the
    // page's script: wait for all seven requests), and nothing went on.
    let after;
    const deadline = Date.now() + 5000;
    for (;;) {
      after = await httpStats(base);
      if (after.responses_4xx - before.responses_4xx >= 7 || Date.now() > deadline) break;
      await sleep(20);
    }
    assert.equal(after.responses_4xx - before.responses_4xx, 7,
      `refusals: ${JSON.stringify({ before, after, answers })}`);
    assert.equal((await up.stats()).requests, upBefore, "a page's call reached the upstream");
    const task = await (await fetch(`${base}/polygw/v1/tasks/job-1`)).json();
    assert.equal(task.state, "running", `the task: ${JSON.stringify(task)}`);

    // DNS rebinding: a name of the attacker's that resolves to the front.
    const rebound = await page.goto(`http://evil.test:${port}/polygw/`, { waitUntil: "load" });
    assert.equal(rebound.status(), 403);

    // An allowed origin calls the front and reads the answer.
    await page.goto(`${friendOrigin}/`, { waitUntil: "load" });
    const friendly = await page.evaluate(async (front) => {
      const r = await fetch(`${front}/v1/chat/completions`, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "allowed" }] }) });
      return { status: r.status, source: r.headers.get("x-polygw-source"), body: await r.json() };
    }, base);
    assert.equal(friendly.status, 200, JSON.stringify(friendly));
    assert.equal(friendly.source, "a");
    assert.equal(friendly.body.choices[0].message.content, "allowed");
    assert.equal((await up.stats()).requests, upBefore + 1);
  } finally {
    try {
      if (browser) await browser.close();
      if (sc) await sc.finish();
      for (const s of [evil, friend]) if (s) s.close();
    } finally {
      await up.stop();
    }
  }
});
