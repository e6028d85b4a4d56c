// The module in Node (onnxruntime-node) against Python ONNX Runtime: logits, labels, top-k.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { BundleError, topK, ViT } from '../src/vit-deploy.mjs';
import { cosine, DIR, f32, IMAGES, index, maxAbs } from '../testing/fixtures.mjs';

const vits = {};
before(async () => {
  vits.fp32 = await ViT.load(path.join(DIR, 'bundle'), { threads: 1 });
  vits.int8 = await ViT.load(path.join(DIR, 'bundle'), { precision: 'int8', threads: 1 });
});
after(async () => { for (const v of Object.values(vits)) await v.release(); });

test('run() gives the logits of Python ONNX Runtime for the same tensor', async () => {
  for (const entry of index.logits) {
    const logits = await vits[entry.precision].run(f32(entry.pixels).slice(), entry.dims);
    const want = f32(entry.file);
    assert.ok(maxAbs(logits, want) <= 1e-5, `${entry.image} ${entry.precision}: ${maxAbs(logits, want)}`);
  }
});

test('int8 (dynamic) runs a batch image by image: two images together give each one\'s logits alone', async () => {
  assert.deepEqual([vits.fp32.info.splitBatches, vits.int8.info.splitBatches], [false, true]);
  const [a, b] = ['hopper-small.png', 'present-alpha.png'].map((image) =>
    index.logits.find((e) => e.image === image && e.precision === 'int8'));
  const [xa, xb] = [a, b].map((e) => f32(e.pixels));
  assert.deepEqual(a.dims, b.dims);
  const both = new Float32Array(xa.length * 2);
  both.set(xa);
  both.set(xb, xa.length);
  const together = await vits.int8.run(both, [2, ...a.dims.slice(1)]);
  const n = together.length / 2;
  for (const [k, e] of [a, b].entries()) {
    const row = together.subarray(k * n, (k + 1) * n);
    const alone = await vits.int8.run(f32(e.pixels).slice(), e.dims);
    assert.deepEqual(row, alone, `${e.image}: its row of the batch against its run alone`);
    const classified = await vits.int8.classify(path.join(IMAGES, e.image)); // one image, as ever
    assert.deepEqual(row, classified.logits, `${e.image}: against classify()`);
    assert.ok(maxAbs(row, f32(e.file)) <= 1e-5, `${e.image}: Python's int8 logits`);
  }
  const all = await vits.int8.runAll(both, [2, ...a.dims.slice(1)]); // every output, batch-first
  assert.deepEqual(all.logits.dims, [2, n]);
  assert.deepEqual(all.logits.data, together);
});

test('classify() of a PNG: the labels, order and probabilities of Python predict()', async () => {
  for (const entry of index.logits.filter((e) => e.image.endsWith('.png'))) {
    const r = await vits[entry.precision].classify(path.join(IMAGES, entry.image), { topK: 5 });
    assert.deepEqual(r.top.map((c) => [c.index, c.label]), entry.top.map((c) => [c.index, c.label]),
      `${entry.image} ${entry.precision}`);
    for (let i = 0; i < 5; i++) assert.ok(Math.abs(r.top[i].probability - entry.top[i].probability) < 1e-6);
    assert.deepEqual(r.inputSize, entry.dims.slice(2));
    assert.equal(r.provider, 'cpu');
  }
});

test('classify() of a JPEG (jpeg-js) keeps the logits within cosine 0.9999 and the same top-1', async () => {
  for (const entry of index.logits.filter((e) => e.image.endsWith('.jpg') && e.precision === 'fp32')) {
    const r = await vits.fp32.classify(path.join(IMAGES, entry.image));
    const c = cosine(r.logits, f32(entry.file));
    assert.ok(c >= 0.9999, `${entry.image}: cosine ${c}`);
    assert.equal(r.top[0].index, entry.top[0].index, entry.image);
  }
});

test('labels come from the manifest; topK sorts by probability, ties by index', () => {
  assert.deepEqual(vits.fp32.labels, index.labels);
  const top = topK(new Float32Array([1, 3, 3, 0]), 3, ['a', 'b', 'c', 'd']);
  assert.deepEqual(top.map((c) => c.label), ['b', 'c', 'a']);
  assert.ok(Math.abs(top.reduce((s, c) => s + c.probability, 0) + Math.exp(0) / (2 * Math.exp(3) + Math.exp(1) + 1) - 1) < 1e-12);
  assert.equal(topK(new Float32Array([1, 2]), 5).length, 2);
});

test('the backend that ran and the threads are reported', () => {
  const { info } = vits.fp32;
  assert.equal(info.backend, 'onnxruntime-node');
  assert.equal(info.provider, 'cpu');
  assert.equal(info.threads, 1);
  assert.equal(info.ortVersion, '1.30.0');
  assert.ok(info.sessionMs > 0);
});

test('a bundle whose weights are external data loads and gives the same logits', async () => {
  const vit = await ViT.load(path.join(DIR, 'bundle-external'), { threads: 1 });
  const entry = index.logits.find((e) => e.precision === 'fp32');
  const logits = await vit.run(f32(entry.pixels).slice(), entry.dims);
  assert.equal(maxAbs(logits, f32(entry.file)), 0);
  await vit.release();
});

test('wrong requests fail with what was expected and what was given', async () => {
  await assert.rejects(ViT.load(path.join(DIR, 'bundle'), { precision: 'int4' }),
    (e) => e instanceof BundleError && /bundle has no "int4" model; it has \["fp32","int8"\]/.test(e.message));
  await assert.rejects(ViT.load(path.join(DIR, 'no-such-bundle')), /manifest .*no-such-bundle\/manifest.json could not be read \(ENOENT\)/);
  await assert.rejects(vits.fp32.run(new Float32Array(3 * 8 * 12), [1, 3, 8, 12]),
    /height and width must be multiples of the patch size 8, got 8x12/);
  await assert.rejects(vits.fp32.run(new Float32Array(10), [1, 3, 8, 8]),
    /dims \[batch, 3, height, width\] matching data's 10 values, got \[1,3,8,8\]/);
});
