// The hand-written index.d.ts stays true to the code: it names exactly what
// index.js exports, and a typical use of the client type-checks (strict).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import * as pgw from "../index.js";

const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

test("index.d.ts declares exactly the exports of index.js", () => {
  const dts = fs.readFileSync(path.join(PKG, "index.d.ts"), "utf8");
  const declared = new Set([...dts.matchAll(/^export (?:declare )?(?:class|function|const) (\w+)/gm)].map((m) => m[1]));
  assert.deepEqual([...declared].sort(), Object.keys(pgw).sort());
});

test("a typical use type-checks against index.d.ts", () => {
  const tsc = path.join(PKG, "node_modules", "typescript", "bin", "tsc");
  try {
    execFileSync(process.execPath, [tsc, "-p", path.join("test", "types")], { cwd: PKG, stdio: "pipe" });
  } catch (e) {
    assert.fail(`tsc: ${e.stdout}${e.stderr}`);
  }
});
