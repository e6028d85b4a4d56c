// Drives Debian's headless Chromium over a site `vit-deploy web` wrote and prints what the
// page computed, as JSON, for tests/website/test_web.py to compare with Python.
//
//   node testing/chromium.mjs JOB.json
//
// JOB: { chromium, gpu?, images: { name: base64 bytes }, pages: [{ url, precision, threads?,
//        backend?, pixels?: preprocessing overrides, check?: true,
//        search?: [image paths], screenshot?: path }],
//        screenshot?: { url, image, path } }
// Out: { pages: [{ info, results: { name: { top, logits, pixels? } },
//        check?: { report, offered }, search?: { result, cards, npy (base64) } }] }
//
// gpu: launch with a WebGPU adapter (SwiftShader, software Vulkan; a page on localhost is a
// secure context, which WebGPU needs); without it Chromium runs with --disable-gpu and offers
// no adapter. check: the page's "check and measure" (?check=1): its report and the backends
// it found. search: a backbone's photo-search page given those files at once: what it
// computed (window.searchResult), the neighbours each card shows, its .npy download; and a
// screenshot of it.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { chromium } from 'playwright-core';

// Without the background-networking flags Chromium stalls on a closed network.
const FLAGS = ['--no-sandbox', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const NO_GPU = ['--disable-gpu'];
const SWIFTSHADER = ['--enable-unsafe-webgpu', '--enable-unsafe-swiftshader',
  '--use-webgpu-adapter=swiftshader'];
const READY_MS = 90_000;
const CHECK_MS = 150_000; // SwiftShader runs a tiny model in a fraction of a second; bounded

const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: job.chromium ?? '/usr/bin/chromium', headless: true,
  args: [...FLAGS, ...(job.gpu ? SWIFTSHADER : NO_GPU)],
  viewport: { width: 860, height: 620 },
});

async function open(url, { precision, threads, backend, check }) {
  const page = await context.newPage();
  page.on('console', (m) => process.stderr.write(`[page ${m.type()}] ${m.text()}\n`));
  page.on('pageerror', (e) => process.stderr.write(`[page error] ${e.message}\n`));
  const query = new URLSearchParams({ precision });
  if (threads) query.set('threads', String(threads));
  if (backend) query.set('backend', backend);
  if (check) query.set('check', '1');
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
    if (spec.check) {
      await page.waitForFunction(() => document.body.dataset.checked, null, { timeout: CHECK_MS });
      const check = await page.evaluate(() => ({ state: document.body.dataset.checked,
        status: document.getElementById('check-status').textContent,
        report: window.checkReport ?? null, offered: window.checkOffered ?? null,
        download: document.getElementById('check-json').download }));
      if (check.state !== 'true') throw new Error(`${spec.url}: the check failed: ${check.status}`);
      out.pages.push({ info: await page.evaluate(() => window.vit.info), check });
      await page.close();
      continue;
    }
    if (spec.search) {
      await page.setInputFiles('#file', spec.search);
      await page.waitForFunction((n) => document.body.dataset.embedded === String(n), spec.search.length,
        { timeout: CHECK_MS });
      const search = await page.evaluate(async () => {
        const npy = new Uint8Array(await (await fetch(document.getElementById('search-npy').href)).arrayBuffer());
        return { result: window.searchResult, status: document.getElementById('search-status').textContent,
          title: document.getElementById('title').textContent, npy: btoa(String.fromCharCode(...npy)),
          cards: [...document.querySelectorAll('#photos .card')].map((c) => ({
            name: c.querySelector('.name').textContent,
            neighbours: [...c.querySelectorAll('li')].map((li) => li.textContent) })) };
      });
      if (spec.screenshot) await page.screenshot({ path: spec.screenshot, fullPage: true });
      out.pages.push({ info: await page.evaluate(() => window.vit.info), search });
      await page.close();
      continue;
    }
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
