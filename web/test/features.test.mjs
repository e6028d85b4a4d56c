// Dense outputs in Node against Python: features() of a bundle with several outputs (pooled,
// logits, patch_tokens, layer_1) as ViTSession.features, and run() / classify() on it.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { BundleError, isGridOutput, ViT } from '../src/vit-deploy.mjs';
import { DIR, f32, IMAGES, index, maxAbs } from '../testing/fixtures.mjs';

const { dense } = index;
const vits = {};
before(async () => {
  vits.dense = await ViT.load(path.join(DIR, 'bundle-dense'), { threads: 1 });
  vits.backbone = await ViT.load(path.join(DIR, 'bundle-backbone'), { threads: 1 });
});
after(async () => { for (const v of Object.values(vits)) await v.release(); });

test('features() gives the grid outputs of Python ViTSession.features (patch_multiple, no crop)', async () => {
  assert.ok(dense.features.length >= 4);
  const P = vits.dense.manifest.patchSize;
  for (const entry of dense.features) {
    const opts = entry.output === 'patch_tokens' ? {} : { output: entry.output }; // the default
    const r = await vits.dense.features(path.join(IMAGES, entry.image), opts);
    const what = `${entry.image} ${entry.output}`;
    assert.deepEqual(r.dims, entry.dims, what);
    assert.equal(r.data.length, entry.dims.reduce((a, b) => a * b, 1), what);
    const d = maxAbs(r.data, f32(entry.file));
    assert.ok(d <= 1e-5, `${what}: max |diff| ${d}`);
    assert.equal(r.output, entry.output);
    assert.deepEqual(r.inputSize, [entry.dims[2] * P, entry.dims[3] * P], what);
    assert.equal(r.provider, 'cpu');
    assert.ok(r.ms.decode >= 0 && r.ms.preprocess >= 0 && r.ms.run > 0, what);
  }
  // the manifest's rule is a centre crop to 32x32: features() did not use it
  assert.equal(vits.dense.manifest.preprocess.resize, 'shorter_side_center_crop');
  assert.ok(dense.features.some((e) => e.dims[2] !== e.dims[3]));
});

test('run() and classify() use the logits output by name when it is not the first', async () => {
  assert.deepEqual(vits.dense.outputNames, dense.outputs);
  assert.notEqual(dense.outputs[0], 'logits');
  for (const entry of dense.logits) {
    const want = f32(entry.file);
    const logits = await vits.dense.run(f32(entry.pixels).slice(), entry.dims);
    assert.equal(logits.length, 10);
    assert.ok(maxAbs(logits, want) <= 1e-5, `${entry.image}: ${maxAbs(logits, want)}`);
    const r = await vits.dense.classify(path.join(IMAGES, entry.image), { topK: 5 });
    assert.ok(maxAbs(r.logits, want) <= 1e-5, entry.image);
    assert.deepEqual(r.top.map((c) => [c.index, c.label]), entry.top.map((c) => [c.index, c.label]));
    assert.deepEqual(r.inputSize, entry.dims.slice(2));
  }
  const entry = dense.logits[0];
  const all = await vits.dense.runAll(f32(entry.pixels).slice(), entry.dims);
  assert.deepEqual(Object.keys(all), dense.outputs);
  assert.deepEqual(all.pooled.dims, [1, 48]);
  assert.deepEqual(all.patch_tokens.dims, [1, 48, 4, 4]);
  assert.ok(maxAbs(all.logits.data, f32(entry.file)) <= 1e-5);
});

test('a backbone: run() gives its first output as Python, classify() says there are no logits', async () => {
  const entry = dense.logits[0];
  assert.deepEqual(vits.backbone.outputNames, ['pooled', 'patch_tokens', 'layer_1']);
  const pooled = await vits.backbone.run(f32(entry.pixels).slice(), entry.dims);
  const want = await vits.dense.runAll(f32(entry.pixels).slice(), entry.dims, ['pooled']);
  assert.ok(maxAbs(pooled, want.pooled.data) <= 1e-5);
  await assert.rejects(vits.backbone.classify(path.join(IMAGES, entry.image)), (e) =>
    e instanceof BundleError && e.message.includes('has no "logits" output to classify with') &&
    e.message.includes('(outputs: ["pooled","patch_tokens","layer_1"])'));
  const f = await vits.backbone.features(path.join(IMAGES, entry.image));
  assert.deepEqual(f.dims, dense.features.find((e) => e.image === entry.image).dims);
});

test('embed() gives Python ViTSession.embed\'s unit vectors, on a backbone and a classifier', async () => {
  assert.ok(dense.embeddings.length >= 2);
  for (const entry of dense.embeddings) {
    const want = f32(entry.file);
    for (const vit of [vits.backbone, vits.dense]) {
      const r = await vit.embed(path.join(IMAGES, entry.image));
      assert.equal(r.output, 'pooled');
      assert.equal(r.dim, want.length);
      assert.ok(maxAbs(r.data, want) <= 1e-5, `${entry.image}: ${maxAbs(r.data, want)}`);
      assert.ok(r.normalized && r.similarity === 'cosine' && r.provider === 'cpu');
    }
    const raw = await vits.backbone.embed(path.join(IMAGES, entry.image), { normalize: false });
    let norm = 0;
    for (const x of raw.data) norm += x * x;
    assert.ok(Math.abs(Math.sqrt(norm) - 1) > 1e-3 && !raw.normalized); // the model's own vector
  }
  await assert.rejects(vits.backbone.classify(path.join(IMAGES, dense.embeddings[0].image)), (e) =>
    e instanceof BundleError && e.message.includes('use embed() for its vectors'));
  await assert.rejects(vits.dense.embed(path.join(IMAGES, dense.embeddings[0].image), { output: 'layer_9' }),
    (e) => e instanceof BundleError && e.message.includes('has no "layer_9" to embed with'));
});

test('features() of an output the bundle lacks, or of one not on the grid, names the outputs', async () => {
  const image = path.join(IMAGES, 'hopper-small.png');
  await assert.rejects(vits.dense.features(image, { output: 'layer_2' }), (e) =>
    e instanceof BundleError && e.message.includes('has no "layer_2" output') &&
    e.message.includes('(outputs: ["pooled","logits","patch_tokens","layer_1"]); export with --layers 2'));
  await assert.rejects(vits.dense.features(image, { output: 'pooled' }), (e) =>
    /output "pooled" is not laid out on the patch grid/.test(e.message) &&
    e.message.includes('this bundle has ["patch_tokens","layer_1"]') &&
    e.message.includes('(outputs: ["pooled","logits","patch_tokens","layer_1"])'));
  await assert.rejects(vits.dense.features(image, { output: 'logits' }), /"logits" is not laid out on the patch grid/);
  // a classic bundle (logits only): no patch tokens
  const classic = await ViT.load(path.join(DIR, 'bundle'), { threads: 1 });
  await assert.rejects(classic.features(image), (e) => e instanceof BundleError &&
    e.message.includes('has no "patch_tokens" output (outputs: ["logits"]); export with --outputs patch_tokens'));
  await assert.rejects(vits.dense.runAll(new Float32Array(3 * 8 * 8), [1, 3, 8, 8], ['nope']),
    /has no "nope" output/);
  await classic.release();
  assert.deepEqual(['patch_tokens', 'layer_12', 'layer_', 'pooled', 'class_token', 'register_tokens']
    .map(isGridOutput), [true, true, false, false, false, false]);
});
