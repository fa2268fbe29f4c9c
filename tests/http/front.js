// The fixture of the native-API tests (anthropic_native.test.js,
// gemini.test.js): a mock upstream that requires `key` as provider
// `dialect` checks it, a sidecar whose HTTP front listens on TCP with the
// configuration `config(mock, port)` gives (the key in env `keyEnv`), and
// GET /metrics of that front.
import fs from "node:fs";
import http from "node:http";
import net from "node:net";

import { Mock, Sidecar, freePort, sleep } from "../../client/node/test/helpers.js";

export const SOURCE = "timeout_s: 20, connect_timeout_s: 5, ttft_timeout_s: 5, " +
  "idle_timeout_s: 20, max_concurrency: 64, aimd: {initial: 64}, breaker: {failures: 100000}";

/** The head of a configuration: listen, server, defaults, http. */
export function configHead(port) {
  return [
    "listen:", '  mode: "0660"',
    "server:", "  log_level: info", "  shutdown_grace_s: 0.5",
    "defaults: {max_attempts: 2, stall_window_s: 5, backoff_base_s: 0.05, backoff_max_s: 0.1}",
    "http:", `  listen: "127.0.0.1:${port}"`,
  ];
}

export async function canConnect(port) {
  return new Promise((resolve) => {
    const s = net.createConnection({ host: "127.0.0.1", port });
    s.once("connect", () => { s.destroy(); resolve(true); });
    s.once("error", () => resolve(false));
  });
}

/** Runs fn({up, sc, port}) with the mock and the sidecar up. */
export async function withFront({ dialect, key, keyEnv, config }, fn) {
  const up = await Mock.start();
  let sc;
  const saved = process.env[keyEnv];
  try {
    await up.control("POST", "/_mock/script", { auth: { dialect, key } });
    const port = await freePort();
    process.env[keyEnv] = key; // the sidecar inherits it
    sc = new Sidecar("");
    fs.writeFileSync(sc.configPath, config(up, port));
    await sc.start();
    while (!(await canConnect(port))) await sleep(20);
    return await fn({ up, sc, port });
  } finally {
    if (saved === undefined) delete process.env[keyEnv];
    else process.env[keyEnv] = saved;
    try {
      if (sc) await sc.finish();
    } finally {
      await up.stop();
    }
  }
}

/** The front's GET /metrics text. */
export function metrics(port) {
  return new Promise((resolve, reject) => {
    http.get({ host: "127.0.0.1", port, path: "/metrics" }, (res) => {
      let text = "";
      res.on("data", (d) => { text += d; });
      res.on("end", () => resolve(text));
    }).on("error", reject);
  });
}
