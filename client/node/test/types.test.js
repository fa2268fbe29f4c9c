// The hand-written index.d.ts and langgraph.d.ts stay true to the code: they
// name exactly what index.js and lib/langgraph.js export, and a typical use
// of the client type-checks (strict).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import * as pgw from "../index.js";
import * as lg from "polygw/langgraph";

const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/** The names a hand-written .d.ts exports (declared, or re-exported with `export { ... }`). */
function declaredIn(file) {
  const dts = fs.readFileSync(path.join(PKG, file), "utf8");
  const names = [...dts.matchAll(/^export (?:declare )?(?:class|function|const) (\w+)/gm)].map((m) => m[1]);
  for (const m of dts.matchAll(/^export \{([^}]*)\};/gm)) names.push(...m[1].split(",").map((n) => n.trim()).filter(Boolean));
  return [...new Set(names)].sort();
}

test("index.d.ts declares exactly the exports of index.js", () => {
  assert.deepEqual(declaredIn("index.d.ts"), Object.keys(pgw).sort());
});

test("langgraph.d.ts declares exactly the exports of polygw/langgraph", () => {
  assert.deepEqual(declaredIn("langgraph.d.ts"), Object.keys(lg).sort());
});

test("a typical use type-checks against index.d.ts", () => {
  const tsc = path.join(PKG, "node_modules", "typescript", "bin", "tsc");
  try {
    execFileSync(process.execPath, [tsc, "-p", path.join("test", "types")], { cwd: PKG, stdio: "pipe" });
  } catch (e) {
    assert.fail(`tsc: ${e.stdout}${e.stderr}`);
  }
});
