// Latency of a site's model in headless Chromium (WebAssembly) and of the same bundle in
// Node (onnxruntime-node), batch 1: median of RUNS after WARMUP, session creation, the
// first run at a new size. Short on purpose (a shared machine): numbers are indicative.
//
//   node testing/bench.mjs chromium JOB.json     JOB: { chromium, pages: [{ url, precision, threads }] }
//   node testing/bench.mjs node BUNDLE PRECISION THREADS
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const RUNS = Number(process.env.RUNS ?? 10);
const WARMUP = 2;
const SIZE = [224, 224];
const NEW_SIZE = [320, 480];

const CONFIG = { runs: RUNS, warmup: WARMUP, size: SIZE, newSize: NEW_SIZE };

async function measure(vit, { runs, warmup, size, newSize }) {
  const make = ([h, w]) => [new Float32Array(3 * h * w).map((_, i) => Math.sin(i) * 0.5), [1, 3, h, w]];
  const [x, dims] = make(size);
  let t = performance.now();
  await vit.run(x, dims);
  const first = performance.now() - t;
  for (let i = 1; i < warmup; i++) await vit.run(x, dims);
  const times = [];
  for (let i = 0; i < runs; i++) { t = performance.now(); await vit.run(x, dims); times.push(performance.now() - t); }
  times.sort((a, b) => a - b);
  const [y, dimsY] = make(newSize);
  t = performance.now();
  await vit.run(y, dimsY);
  const firstNew = performance.now() - t;
  t = performance.now();
  await vit.run(y, dimsY);
  const secondNew = performance.now() - t;
  return { median: times[Math.floor(times.length / 2)], min: times[0], first, firstNew, secondNew, info: vit.info };
}

// Peak resident memory (VmHWM, MB) of the renderer processes of the browser started with
// this profile (Linux /proc; null elsewhere): what the page's tab held at most, the
// WebAssembly heap included.
function rendererPeakMB(profile) {
  if (!fs.existsSync('/proc')) return null;
  const procs = new Map();
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const ppid = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1];
      procs.set(pid, { ppid, cmd: fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8') });
    } catch { /* the process ended meanwhile */ }
  }
  const ours = new Set([...procs].filter(([, p]) => p.cmd.includes(profile)).map(([pid]) => pid));
  for (let grew = true; grew;) { // and every descendant (zygotes, renderers)
    grew = false;
    for (const [pid, p] of procs) if (!ours.has(pid) && ours.has(p.ppid)) { ours.add(pid); grew = true; }
  }
  let peak = null;
  for (const pid of ours) {
    if (!procs.get(pid).cmd.includes('--type=renderer')) continue;
    try {
      const hwm = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
      if (hwm) peak = Math.max(peak ?? 0, Number(hwm[1]) / 1024);
    } catch { /* ended */ }
  }
  return peak;
}

if (process.argv[2] === 'node') {
  const { ViT } = await import('../src/vit-deploy.mjs');
  const [, , , bundle, precision, threads] = process.argv;
  const vit = await ViT.load(bundle, { precision, threads: Number(threads) });
  const r = await measure(vit, CONFIG);
  console.log(JSON.stringify({ ...r, peakMB: process.resourceUsage().maxRSS / 1024 }));
} else {
  const { chromium } = await import('playwright-core');
  const job = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
  const out = [];
  for (const spec of job.pages) { // a fresh browser per case: threads are fixed per page load
    const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-bench-'));
    const context = await chromium.launchPersistentContext(profile, { executablePath: job.chromium, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
        '--disable-component-update', '--disable-sync'] });
    const page = await context.newPage();
    await page.goto(`${spec.url}?precision=${spec.precision}&threads=${spec.threads}`);
    await page.waitForFunction(() => document.body.dataset.ready, null, { timeout: 300_000 });
    const r = await page.evaluate(`(${measure.toString()})(window.vit, ${JSON.stringify(CONFIG)})`);
    out.push({ ...spec, ...r, peakMB: rendererPeakMB(profile) });
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  console.log(JSON.stringify(out));
}
