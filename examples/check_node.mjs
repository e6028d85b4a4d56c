// Prove a bundle in Node: `vit.check()` runs every golden reference the bundle stores
// (references.bin) and writes the shared report ("vit-deploy-report" v1, the schema of
// Python's `vit-deploy check --json` and the page's download), so `vit-deploy bench
// --compare` lays it beside the others. In an app: `npm install` the tarball `npm pack` writes in web/; in this
// repository `make setup` links node_modules/vit-deploy to web/, as npm would.
//
//   node examples/check_node.mjs BUNDLE [--precision int8] [--latency-runs 10] [--threads 2] [--json FILE]
//
// Prints one line per case; --json FILE writes the report. Exits 1 if a case fails.
import fs from 'node:fs';
import { parseArgs } from 'node:util';

import { ViT } from 'vit-deploy';

const usage = 'usage: node examples/check_node.mjs BUNDLE [--precision P] [--latency-runs N] [--threads N] [--json FILE]';
let args;
try {
  args = parseArgs({
    allowPositionals: true,
    options: { precision: { type: 'string', default: 'fp32' },
      'latency-runs': { type: 'string', default: '10' }, threads: { type: 'string' },
      json: { type: 'string' } },
  });
} catch (e) {
  console.error(`${e.message}\n${usage}`);
  process.exit(2);
}
const [bundle, ...rest] = args.positionals;
const latencyRuns = Number(args.values['latency-runs']);
const threads = args.values.threads === undefined ? undefined : Number(args.values.threads);
if (!bundle || rest.length || !Number.isInteger(latencyRuns) || latencyRuns < 0 ||
  (threads !== undefined && !(Number.isInteger(threads) && threads >= 1))) {
  console.error(usage);
  process.exit(2);
}

try {
  const vit = await ViT.load(bundle, { precision: args.values.precision, threads });
  const report = await vit.check({ latencyRuns });
  await vit.release();
  console.log(`${bundle} (${args.values.precision}) on ${report.device.runtime}`);
  for (const c of report.cases) {
    console.log(`${c.provider} ${c.precision} ${c.label} ${c.resolution.join('x')} ${c.output}: ` +
      `max|Δ| ${c.max_abs.toExponential(1)}, cosine ${c.cosine.toFixed(7)} ${c.passed ? 'ok' : 'FAIL'}`);
  }
  for (const l of report.latency) {
    console.log(`latency ${l.provider} ${l.precision}: p50 ${l.p50_ms.toFixed(2)} ms, ` +
      `p90 ${l.p90_ms.toFixed(2)} ms (${l.runs} runs)`);
  }
  console.log(`check: ${report.passed ? 'PASS' : 'FAIL'}`);
  if (args.values.json) fs.writeFileSync(args.values.json, `${JSON.stringify(report, null, 2)}\n`);
  process.exit(report.passed ? 0 : 1);
} catch (e) {
  console.error(`Error: ${e.message}`);
  process.exit(e.name === 'BundleError' ? 2 : 1);
}
