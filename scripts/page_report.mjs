// Runs the demo page's "check and measure" (?check=1) in Debian's headless Chromium and saves
// the report it offers for download ("vit-deploy-report" v1, the schema of Python's `check
// --json` and Node's vit.check()), for `vit-deploy bench --compare`. Drives the page through
// web/testing/chromium.mjs (what tests/website/test_web.py uses).
//
//   vit-deploy web BUNDLE --out site --precision fp32,int8 --serve --port 8080   # elsewhere
//   node scripts/page_report.mjs http://127.0.0.1:8080/ --precision fp32,int8 \
//       [--webgpu] --json 'page-{precision}.json'
//
// --webgpu: launch Chromium with a WebGPU adapter (SwiftShader, software Vulkan: correctness,
// not speed); the page then checks webgpu and wasm in one report. Without it Chromium runs
// with --disable-gpu and the page checks WebAssembly alone. {precision} in --json is
// replaced by each precision (needed when there are several). Exits 1 if a check fails.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const usage = 'usage: node scripts/page_report.mjs URL [--precision fp32,int8] [--webgpu] ' +
  '[--chromium /usr/bin/chromium] --json FILE';
let args;
try {
  args = parseArgs({
    allowPositionals: true,
    options: { precision: { type: 'string', default: 'fp32' }, webgpu: { type: 'boolean' },
      chromium: { type: 'string', default: '/usr/bin/chromium' }, json: { type: 'string' } },
  });
} catch (e) {
  console.error(`${e.message}\n${usage}`);
  process.exit(2);
}
const [url, ...rest] = args.positionals;
const precisions = args.values.precision.split(',').filter(Boolean);
const out = args.values.json;
if (!url || rest.length || !out || !precisions.length ||
  (precisions.length > 1 && !out.includes('{precision}'))) {
  console.error(usage);
  process.exit(2);
}

const web = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'web');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-page-report-'));
try {
  const job = path.join(tmp, 'job.json');
  fs.writeFileSync(job, JSON.stringify({ chromium: args.values.chromium, gpu: !!args.values.webgpu,
    images: {}, pages: precisions.map((precision) => ({ url, precision, check: true })) }));
  const r = spawnSync(process.execPath, ['testing/chromium.mjs', job], { cwd: web,
    encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 64 << 20 });
  if (r.status !== 0) {
    console.error(`Error: the page's check did not finish (exit ${r.status ?? r.signal})`);
    process.exit(1);
  }
  let passed = true;
  JSON.parse(r.stdout).pages.forEach(({ info, check }, i) => {
    const file = out.replaceAll('{precision}', precisions[i]);
    fs.writeFileSync(file, `${JSON.stringify(check.report, null, 2)}\n`);
    const backends = check.offered?.backends?.join(', ') ?? info.provider;
    console.log(`${precisions[i]} on ${backends} (${info.gpu ?? 'no GPU adapter'}): ` +
      `check ${check.report.passed ? 'PASS' : 'FAIL'}, ${check.report.cases.length} cases -> ${file}`);
    passed &&= check.report.passed;
  });
  process.exit(passed ? 0 : 1);
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
