// Drives Debian's headless Chromium over a site `vit-deploy web` wrote and prints what the
// page computed, as JSON, for tests/test_web.py to compare with Python.
//
//   node testing/chromium.mjs JOB.json
//
// JOB: { chromium, images: { name: base64 bytes }, pages: [{ url, precision, threads?,
//        pixels?: preprocessing overrides }], screenshot?: { url, image, path } }
// Out: { pages: [{ info, results: { name: { top, logits, pixels? } } }] }
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { chromium } from 'playwright-core';

// Without the background-networking flags Chromium stalls on a closed network.
const FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const READY_MS = 90_000;

const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: job.chromium ?? '/usr/bin/chromium', headless: true, args: FLAGS,
  viewport: { width: 860, height: 620 },
});

async function open(url, { precision, threads }) {
  const page = await context.newPage();
  page.on('console', (m) => process.stderr.write(`[page ${m.type()}] ${m.text()}\n`));
  page.on('pageerror', (e) => process.stderr.write(`[page error] ${e.message}\n`));
  const query = new URLSearchParams({ precision });
  if (threads) query.set('threads', String(threads));
  await page.goto(`${url}?${query}`);
  await page.waitForFunction(() => document.body.dataset.ready, null, { timeout: READY_MS });
  if (await page.evaluate(() => document.body.dataset.ready) !== 'true') {
    throw new Error(`${url}: the page failed: ${await page.textContent('#status')}`);
  }
  return page;
}

try {
  const out = { pages: [] };
  for (const spec of job.pages) {
    const page = await open(spec.url, spec);
    const result = await page.evaluate(async ({ images, pixels }) => {
      const results = {};
      for (const [name, b64] of Object.entries(images)) {
        const blob = new Blob([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))]);
        const r = await window.vit.classify(blob, { topK: 5 });
        results[name] = { top: r.top, logits: Array.from(r.logits), ms: r.ms };
        if (pixels) results[name].pixels = Array.from((await window.vit.pixels(blob, pixels)).data);
      }
      return { info: window.vit.info, results };
    }, { images: job.images, pixels: spec.pixels ?? null });
    out.pages.push(result);
    await page.close();
  }
  if (job.screenshot) {
    const page = await open(job.screenshot.url, { precision: job.screenshot.precision ?? 'fp32' });
    await page.setInputFiles('#file', job.screenshot.image);
    await page.waitForFunction(() => document.body.dataset.classified, null, { timeout: READY_MS });
    await page.screenshot({ path: job.screenshot.path, fullPage: true });
    await page.close();
  }
  process.stdout.write(JSON.stringify(out));
} finally {
  await context.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
