// SigLIP 2 NaFlex preprocessing (lib/naflex.mjs) on its own: sizes, patch layout, padding,
// errors. Against Python, bit for bit, on photographs and odd sizes, and the graph in
// onnxruntime-node against Python's onnxruntime: tests/test_naflex_js.py.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { NaFlex, NaFlexPreprocess, sizeForMaxNumPatches } from '../src/node.mjs';

test("the patch budget's sizes are transformers' (values from Python)", () => {
  // vit_deploy.runtime.naflex.preprocess.size_for_max_num_patches(h, w, patch, budget)
  for (const [args, want] of [[[448, 299, 16, 256], [304, 208]], [[1, 500, 16, 64], [16, 1024]],
    [[2000, 40, 16, 1024], [3264, 80]], [[1, 1, 16, 64], [112, 112]], [[17, 17, 14, 729], [378, 378]]]) {
    assert.deepEqual(sizeForMaxNumPatches(...args), want, show(args));
  }
});

test('patches are (row, column, channel) in raster order, padded and masked', () => {
  // 2 x 3 patches of 2 x 2 pixels, each patch one colour: patch k is (k, 10 k, 255 - k)
  const P = 2;
  const data = new Uint8Array(4 * 6 * 3);
  for (let y = 0; y < 4; y++) {
    for (let x = 0; x < 6; x++) {
      const k = Math.floor(y / P) * 3 + Math.floor(x / P);
      data.set([k, 10 * k, 255 - k], (y * 6 + x) * 3);
    }
  }
  const pre = new NaFlexPreprocess({ patchSize: P, maxNumPatches: 8, mean: [0], std: [1], scale: 1 });
  const b = pre.batch([{ data, width: 6, height: 4, channels: 3 }]);
  assert.deepEqual(b.pixelValues.dims, [1, 8, 12]);
  assert.deepEqual([...b.spatialShapes.data], [2n, 3n]);
  assert.deepEqual([...b.pixelAttentionMask.data], [1, 1, 1, 1, 1, 1, 0, 0]);
  for (let k = 0; k < 6; k++) {
    const row = [...b.pixelValues.data.subarray(k * 12, (k + 1) * 12)];
    assert.deepEqual(row, Array(4).fill([k, 10 * k, 255 - k]).flat(), `patch ${k}`);
  }
  assert.ok(b.pixelValues.data.subarray(6 * 12).every((v) => v === 0), 'padding is zeros');
});

test('images of different aspect ratios share one batch; white is 1 under mean = std = 0.5', () => {
  const white = (w, h) => ({ data: new Uint8Array(w * h * 4).fill(255), width: w, height: h });
  const pre = new NaFlexPreprocess({ maxNumPatches: 25, patchSize: 8 });
  const b = pre.batch([white(90, 10), white(10, 90), white(40, 40)]);
  assert.deepEqual([...b.spatialShapes.data].map(Number), [2, 12, 12, 2, 5, 5]);
  assert.deepEqual(b.pixelValues.dims, [3, 25, 192]);
  const real = [...b.pixelAttentionMask.data].reduce((a, v) => a + v, 0);
  assert.equal(real, 24 + 24 + 25);
  assert.equal(b.pixelValues.data[0], 1);
});

test('bad options and inputs are refused, saying what was expected and what was given', async () => {
  for (const bad of [0, 65537, 2.5, true]) {
    assert.throws(() => new NaFlexPreprocess({ maxNumPatches: bad }),
      new RegExp(`maxNumPatches must be an integer from 1 to 65536, got ${show(bad)}`));
  }
  assert.throws(() => new NaFlexPreprocess({ mean: [0.5, 0.5], std: [0.5, 0.5] }), /1 or 3 values \(RGB\), got 2/);
  assert.throws(() => new NaFlexPreprocess().batch([]), /at least one image, got none/);
  assert.throws(() => new NaFlexPreprocess().batch({ data: new Uint8Array(5), width: 2, height: 1 }),
    /3 or 4 bytes a pixel, got 5 bytes for 2x1/);
  await assert.rejects(NaFlex.load('/nonexistent/model.onnx', { threads: 0 }), /threads must be an integer from 1 to 256/);
  await assert.rejects(NaFlex.load('/nonexistent/model.onnx'), /model \/nonexistent\/model.onnx could not be read \(ENOENT\)/);
});

function show(v) { return JSON.stringify(v).replace(/[[\]]/g, '\\$&'); }

test("a NaFlex bundle's manifest gives the preprocessing; others are refused by name", async () => {
  const { naflexManifest } = await import('../src/lib/naflex.mjs');
  const m = { config: { name: 'hf-siglip2' }, io: { patch_size: 16 }, models: { fp32: 'model.onnx', int8: 'model.int8.onnx' },
    preprocess: { resize: 'naflex', mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5], scale: 1 / 255, max_num_patches: 64 } };
  assert.deepEqual(naflexManifest(m), { patchSize: 16, maxNumPatches: 64, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5],
    scale: 1 / 255, models: { fp32: 'model.onnx', int8: 'model.int8.onnx' }, name: 'hf-siglip2' });
  assert.throws(() => naflexManifest({ ...m, preprocess: { ...m.preprocess, resize: 'squash' } }, 'manifest m.json'),
    { name: 'BundleError', message: 'manifest m.json: not a NaFlex bundle (preprocess.resize is "squash", expected "naflex"); load it with ViT.load' });
  assert.throws(() => naflexManifest({ ...m, preprocess: { ...m.preprocess, max_num_patches: 0 } }),
    { name: 'BundleError', message: /maxNumPatches must be an integer from 1 to 65536, got 0/ });
  assert.throws(() => naflexManifest({ ...m, models: { fp32: 3 } }), { name: 'BundleError', message: /models must map precisions to files/ });
});

test('options are checked before anything is read, as ViT.load checks them', async () => {
  // precision 16 was taken as a name (the model file's error came first); threads too
  for (const options of [{ threads: 0 }, { allowLarge: 'yes' }, { precision: 16 }]) {
    await assert.rejects(NaFlex.load('/no-such-bundle', options), (e) => e.name === 'Error' &&
      /must be/.test(e.message), JSON.stringify(options));
  }
});
