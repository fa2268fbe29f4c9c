// What the headless Chromium tests (status.test.js, cross_origin.test.js)
// share: the browser, launched by puppeteer-core, the sidecar's
// configuration, and the wait for its HTTP front to answer.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

import puppeteer from "puppeteer-core";

import { sleep } from "../../client/node/test/helpers.js";

export const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

/** Debian's Chromium, headless, quiet; `args` are more switches. */
export function launchChromium(args = []) {
  assert.ok(fs.existsSync(CHROMIUM), `${CHROMIUM} missing: run tests/deps.sh`);
  return puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
      "--disable-dev-shm-usage", "--disable-background-networking",
      "--disable-component-update", "--disable-default-apps", "--disable-sync", ...args],
  });
}

/** Resolves once GET `base`/healthz answers 200 (10 s at most). */
export async function waitHttp(base) {
  const deadline = Date.now() + 10000;
  for (;;) {
    try {
      const r = await fetch(`${base}/healthz`);
      if (r.ok) return;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) throw new Error("the HTTP front did not start");
    await sleep(20);
  }
}

/** What every source of these tests sets, after name, capability and base_url. */
export const SOURCE_KEYS = "timeout_s: 20, connect_timeout_s: 5, ttft_timeout_s: 5, " +
  "idle_timeout_s: 20, max_concurrency: 8, aimd: {initial: 8}";

/** A configuration with the HTTP front on 127.0.0.1:`port` and its socket in
 * `dir`; `http`: more lines of the http section; `sources`: the list's items. */
export function frontConfig(dir, port, { http = [], sources = [] }) {
  return [
    "listen:", '  mode: "0660"',
    "server:", "  log_level: info", "  shutdown_grace_s: 0.5",
    "defaults: {max_attempts: 1, stall_window_s: 10, backoff_base_s: 0.05, backoff_max_s: 0.1}",
    "http:", `  socket: ${JSON.stringify(path.join(dir, "http.sock"))}`, `  listen: "127.0.0.1:${port}"`,
    ...http,
    "sources:",
    ...sources,
    "",
  ].join("\n");
}
