// The two runtimes refuse the same things: tests/data/hostile-runtime.json's hostile manifests
// and options, run here through readManifest / ViT.load / classify (and by
// tests/test_hostile_table.py through Python's load_manifest / ViTSession / RuntimeOptions /
// predict), each error matched against the one expression both must meet. Then what only
// this runtime has: web.json's threads, the memory guard before any allocation (allowLarge
// lifts it), and every run method after release().
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { BundleError, readManifest, ViT } from '../src/vit-deploy.mjs';
import { availableMemory } from '../src/lib/platform-node.mjs';
import { DIR, IMAGES } from '../testing/fixtures.mjs';

const TABLE = JSON.parse(fs.readFileSync(
  path.join(import.meta.dirname, '..', '..', 'tests', 'data', 'hostile-runtime.json'), 'utf8')).cases;
const SOURCE = path.join(DIR, 'bundle');
const IMAGE = path.join(IMAGES, 'hopper-small.png');
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-hostile-'));

/** The table's JSON with {"$": "NaN"} as the number it names. */
const value = (v) => (v !== null && typeof v === 'object' && !Array.isArray(v) &&
  Object.keys(v).length === 1 && '$' in v ? Number(v.$) : v);

let copies = 0;
/** A copy of the fixture bundle with `changes` ({dotted path: value; null deletes}) applied
 * to its manifest: [directory, manifest]. */
function bundle(changes = {}) {
  const dir = path.join(TMP, `b${copies++}`);
  fs.cpSync(SOURCE, dir, { recursive: true });
  const m = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'));
  for (const [dotted, v] of Object.entries(changes)) {
    const keys = dotted.split('.');
    const last = keys.pop();
    const node = keys.reduce((n, k) => n[k], m);
    if (v === null) delete node[last];
    else node[last] = value(v);
  }
  fs.writeFileSync(path.join(dir, 'manifest.json'), JSON.stringify(m));
  return [dir, m];
}

async function errorOf(fn) {
  try {
    await fn();
  } catch (e) {
    return e;
  }
  return null;
}

function expect(c, error, what) {
  if (c.error === null) {
    assert.equal(error, null, `${c.name}: ${what} refused it: ${error?.message}`);
    return;
  }
  assert.ok(error, `${c.name}: ${what} accepted it`);
  assert.match(error.message, new RegExp(c.error, 'i'), `${c.name}: ${what}`);
}

for (const c of TABLE) {
  test(`hostile table: ${c.name}`, async () => {
    const [dir, m] = bundle(c.manifest);
    if (c.stage === 'manifest') {
      const read = await errorOf(() => readManifest(m));
      if (read) expect(c, read, 'readManifest'); // refused as it is read: the table's message
      expect(c, await errorOf(async () => (await ViT.load(dir)).release()), 'ViT.load');
    } else if (c.stage === 'load') {
      const options = { threads: value(c.threads ?? null) ?? undefined, precision: c.precision };
      expect(c, await errorOf(async () => (await ViT.load(dir, options)).release()), 'ViT.load');
    } else {
      assert.equal(c.stage, 'classify');
      const vit = await ViT.load(dir, { threads: 1 });
      if (c.released) await vit.release();
      const error = await errorOf(() => vit.classify(IMAGE, { topK: value(c.topK) }));
      await vit.release();
      expect(c, error, 'classify');
    }
  });
}

// -- what only this runtime has ----------------------------------------------------------------
test("web.json's threads are checked as the caller's (a BundleError naming the file)", async () => {
  for (const threads of [0, -1, 1.5, true, 100000, '4']) {
    const [dir] = bundle();
    fs.writeFileSync(path.join(dir, 'web.json'), JSON.stringify({ threads }));
    await assert.rejects(ViT.load(dir), (e) => e instanceof BundleError &&
      /web\.json: threads must be an integer from 1 to 256/.test(e.message), String(threads));
    // the caller's threads win over the bundle's word
    await (await ViT.load(dir, { threads: 1 })).release();
  }
  const [dir] = bundle();
  fs.writeFileSync(path.join(dir, 'web.json'), JSON.stringify({ threads: 2 }));
  const vit = await ViT.load(dir);
  assert.equal(vit.info.threadsRequested, 2);
  await vit.release();
});

test('options are checked before anything is read', async () => {
  const missing = path.join(TMP, 'no-such-bundle');
  for (const options of [{ threads: 0 }, { threads: 1e5 }, { allowLarge: 'yes' }, { precision: 16 }]) {
    await assert.rejects(ViT.load(missing, options), (e) => !(e instanceof BundleError) &&
      /must be/.test(e.message), JSON.stringify(options));
  }
});

test('the memory guard refuses before the input is allocated; allowLarge lifts it', async () => {
  const vit = await ViT.load(SOURCE, { threads: 1 });
  const dense = await ViT.load(path.join(DIR, 'bundle-dense'), { threads: 1 }); // patch_tokens
  try {
    // a 4096x4096 input: 262145 tokens, 1.5 TiB of attention, refused before the 201 MB input
    // (or the resize to it) exists: in classify, pixels and features
    const huge = new RegExp(String.raw`4096x4096 \(batch 1\) means 262145 tokens: attention ` +
      String.raw`needs about 1536\.4 GiB, and [0-9.]+ GiB are available; use a smaller size ` +
      String.raw`\(or allowLarge: true to try anyway\)$`);
    await assert.rejects(vit.classify(IMAGE, { resolution: 4096 }), huge);
    await assert.rejects(vit.pixels(IMAGE, { resolution: 4096 }), huge);
    await assert.rejects(dense.features(IMAGE, { resolution: [4096, 4096], resize: 'squash' }), huge);
    // runAll: the estimate for the whole batch, before ONNX Runtime sees it; the smallest
    // square this machine refuses (tiny/8: 3 heads, width 48, one class token)
    const limit = 0.8 * await availableMemory();
    let k = 1;
    const need = (g) => 2 * 4 * (2 * 3 * (g * g + 1) ** 2 + 8 * (g * g + 1) * 48);
    while (need(k) <= limit) k++;
    const side = 8 * k;
    await assert.rejects(vit.runAll(new Float32Array(2 * 3 * side * side), [2, 3, side, side]),
      new RegExp(`${side}x${side} \\(batch 2\\) means ${k * k + 1} tokens: attention needs about`));
  } finally {
    await vit.release();
    await dense.release();
  }
  const large = await ViT.load(SOURCE, { threads: 1, allowLarge: true });
  try { // lifted: nothing refused for its size; a size any machine runs runs as before
    assert.equal(large.allowLarge, true);
    assert.equal((await large.classify(IMAGE, { topK: 1 })).top.length, 1);
  } finally {
    await large.release();
  }
});

test('every run method after release() says the ViT was released', async () => {
  const vit = await ViT.load(SOURCE, { threads: 1 });
  await vit.release();
  await vit.release(); // twice: nothing to free
  const released = /this ViT was released .*load .* again with ViT\.load/;
  await assert.rejects(vit.classify(IMAGE), released);
  await assert.rejects(vit.features(IMAGE), released);
  await assert.rejects(vit.run(new Float32Array(3 * 64), [1, 3, 8, 8]), released);
  await assert.rejects(vit.runAll(new Float32Array(3 * 64), [1, 3, 8, 8]), released);
  await assert.rejects(vit.check(), released);
});

test('a backend is a name or an order of preference, checked as Python checks providers', async () => {
  const { backendPreference } = await import('../src/lib/common.mjs');
  assert.deepEqual(backendPreference('webgpu,wasm', ['webgpu', 'wasm']), ['webgpu', 'wasm']);
  assert.deepEqual(backendPreference(' auto ', ['cpu']), ['auto']);
  for (const bad of ['', ',', 'cuda', 'webgpu,cuda', 5, null, ['wasm']]) {
    assert.throws(() => backendPreference(bad, ['webgpu', 'wasm']),
      /backend must be 'auto', one of \["webgpu","wasm"\] or a comma-separated order/);
  }
  const { loadOrt } = await import('../src/lib/platform-node.mjs');
  await assert.rejects(loadOrt('wasm'), /backend must be 'auto', one of \["cpu"\]/);
  assert.equal((await loadOrt('cpu')).backend, 'cpu');
});
