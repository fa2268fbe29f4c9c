// The status page (GET /polygw/, docs/OPERATIONS.md §5) in a real browser:
// Debian's headless Chromium driven by puppeteer-core, against the real
// sidecar and the real mock upstream. The page shows the source closed;
// failing calls through the sidecar trip its breaker and the page's DOM
// shows it open within 2 s; a running task shows with its node; every
// request the page makes goes to the sidecar. The screenshot goes to the
// build directory (STATUS_SCREENSHOT overrides the path), never to docs/.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { BUILD, Mock, Sidecar, freePort } from "../../client/node/test/helpers.js";
import { SOURCE_KEYS, frontConfig, launchChromium, waitHttp } from "./browser.js";

const FAILURES = 3; // breaker.failures of source "a"
const TRIP_TO_DOM_MS = 2000;

function configText(upUrl, port, dir) {
  return frontConfig(dir, port, { sources: [
    `  - {name: a, capability: chat, base_url: ${JSON.stringify(upUrl)}, ${SOURCE_KEYS}, ` +
      `breaker: {failures: ${FAILURES}, cooldown_s: 60}, limits: {rpm: 600}}`,
    `  - {name: e, capability: embedding, base_url: ${JSON.stringify(upUrl)}, model: emb-1, ${SOURCE_KEYS}}`,
  ] });
}

async function post(base, p, body) {
  const r = await fetch(base + p, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

async function breakerOf(base, name) {
  const st = await (await fetch(`${base}/polygw/v1/stats`)).json();
  return st.sources.find((s) => s.name === name).breaker;
}

test("status page: breaker trip shows within 2 s, a task with its node, nothing from other hosts",
  { timeout: 120000 }, async () => {
    const up = await Mock.start();
    let sc, browser;
    try {
      const port = await freePort();
      const base = `http://127.0.0.1:${port}`;
      sc = new Sidecar("");
      fs.writeFileSync(sc.configPath, configText(up.url, port, sc.dir));
      await sc.start();
      await waitHttp(base);

      browser = await launchChromium();
      const page = await browser.newPage();
      await page.setViewport({ width: 1280, height: 640 });
      const requests = [];
      await page.setRequestInterception(true);
      page.on("request", (req) => {
        requests.push(req.url());
        if (req.url().startsWith(`${base}/`)) req.continue();
        else req.abort();
      });
      const pageErrors = [];
      page.on("pageerror", (e) => pageErrors.push(String(e)));

      const resp = await page.goto(`${base}/polygw/`, { waitUntil: "load" });
      assert.equal(resp.status(), 200);
      assert.match(resp.headers()["content-type"], /^text\/html/);
      await page.waitForSelector('body[data-state="ok"]', { timeout: 5000 });
      await page.waitForSelector('tr[data-source="a"] td[data-breaker="closed"]', { timeout: 5000 });
      await page.waitForSelector('tr[data-source="e"] td[data-breaker="closed"]', { timeout: 5000 });
      assert.equal(await page.$eval('tr[data-source="a"]', (tr) => tr.dataset.capability), "chat");

      // A running task, on a node with an explicit watchdog timeout.
      assert.equal((await post(base, "/polygw/v1/tasks/job-7/start", {})).status, 200);
      const nb = await post(base, "/polygw/v1/tasks/job-7/node_begin", { node: "plan", timeout_s: 30 });
      assert.equal(nb.status, 200, JSON.stringify(nb.body));
      await page.waitForSelector('tr[data-task="job-7"] td[data-node="plan"]', { timeout: 3000 });
      const age = await page.$eval('tr[data-task="job-7"] td[data-field="node_age"]', (td) => td.textContent);
      assert.match(age, /\/ 30\.0 s$/);

      // One success, then failures until the breaker opens.
      const ok = await post(base, "/v1/chat/completions",
        { model: "m", messages: [{ role: "user", content: "hi" }] });
      assert.equal(ok.status, 200, JSON.stringify(ok.body));
      await up.control("POST", "/_mock/script", { default: { status: 500 } });
      let trippedAt = 0;
      for (let i = 0; i < FAILURES; i++) {
        const r = await post(base, "/v1/chat/completions",
          { model: "m", messages: [{ role: "user", content: "hi" }] });
        assert.ok(r.status >= 500, `call ${i} answered ${r.status}`);
        trippedAt = Date.now();
      }
      assert.equal(await breakerOf(base, "a"), "open", "the breaker did not open");
      await page.waitForSelector('tr[data-source="a"] td[data-breaker="open"]', { timeout: TRIP_TO_DOM_MS });
      const shownAfterMs = Date.now() - trippedAt;
      assert.ok(shownAfterMs <= TRIP_TO_DOM_MS, `open shown ${shownAfterMs} ms after the trip`);
      console.log(`# breaker open on the page ${shownAfterMs} ms after the tripping call answered`);
      // Only that source: the embedding source stays closed.
      assert.equal(await page.$eval('tr[data-source="e"] td[data-breaker]', (td) => td.dataset.breaker), "closed");
      await page.waitForFunction(() => Number(document.querySelector(
        'tr[data-source="a"] [data-outcome="failure"]')?.dataset.count) === 3, { timeout: 3000 });

      const shot = process.env.STATUS_SCREENSHOT || path.join(BUILD, "status-page.png");
      await page.screenshot({ path: shot, fullPage: true });
      assert.ok(fs.statSync(shot).size > 1000);

      assert.deepEqual(pageErrors, []);
      const foreign = requests.filter((u) => !u.startsWith(`${base}/`));
      assert.deepEqual(foreign, [], "the page asked another host");
      assert.ok(requests.some((u) => u === `${base}/polygw/v1/stats`), "the page never polled the stats");
    } finally {
      try {
        if (browser) await browser.close();
        if (sc) await sc.finish();
      } finally {
        await up.stop();
      }
    }
  });

test("status page: what each source and app spent, and what their budgets have left",
  { timeout: 120000 }, async () => {
    const up = await Mock.start();
    let sc, browser;
    try {
      const port = await freePort();
      const base = `http://127.0.0.1:${port}`;
      sc = new Sidecar("");
      fs.writeFileSync(sc.configPath, frontConfig(sc.dir, port, { sources: [
        `  - {name: a, capability: chat, base_url: ${JSON.stringify(up.url)}, ${SOURCE_KEYS}, ` +
          "prices: {input: 0, output: 1000}, budget: {daily: 10}}",
        `  - {name: free, capability: embedding, base_url: ${JSON.stringify(up.url)}, ${SOURCE_KEYS}}`,
        "apps:",
        "  - {name: default, capabilities: [chat], budget: {total: 3}}",
      ] }));
      await sc.start();
      await waitHttp(base);
      const r = await post(base, "/v1/chat/completions", { model: "m", max_tokens: 1000,
        messages: [{ role: "user", content: "x" }],
        mock: { usage: { prompt_tokens: 5, completion_tokens: 250 } } });
      assert.equal(r.status, 200, JSON.stringify(r.body));

      browser = await launchChromium();
      const page = await browser.newPage();
      await page.goto(`${base}/polygw/`, { waitUntil: "load" });
      await page.waitForSelector('body[data-state="ok"]', { timeout: 5000 });
      const cell = (row, field) => page.$eval(`${row} td[data-field="${field}"]`, (td) => td.textContent);
      assert.equal(await cell('tr[data-source="a"]', "cost"), "0.2500 USD");
      assert.equal(await cell('tr[data-source="a"]', "budget_left"), "9.75 (daily)");
      assert.equal(await cell('tr[data-source="free"]', "cost"), "–"); // unpriced: no cost, not 0
      assert.equal(await cell('tr[data-source="free"]', "budget_left"), "–");
      assert.equal(await cell('tr[data-app="default"]', "cost"), "0.2500 USD");
      assert.equal(await cell('tr[data-app="default"]', "budget_left"), "2.75 (total)");
    } finally {
      if (browser) await browser.close();
      if (sc) await sc.finish();
      await up.stop();
    }
  });
