// The JavaScript preprocessing against Python's (runtime/preprocess.py), tensor by tensor.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { BundleError, decodeImage, ImageError, Preprocess, pyRound, readManifest } from '../src/vit-deploy.mjs';
import { DIR, f32, IMAGES, index, maxAbs } from '../testing/fixtures.mjs';

const manifest = readManifest(JSON.parse(fs.readFileSync(path.join(DIR, 'bundle', 'manifest.json'), 'utf8')));
const rgb = (name) => {
  const { file, width, height } = index.rgb[name];
  return { data: new Uint8Array(fs.readFileSync(path.join(DIR, file))), width, height, channels: 3 };
};
// One 8-bit step of channel c, in the normalised tensor: the unit of the parity bound.
const steps = (got, want, entry) => {
  const plane = got.length / 3;
  let worst = 0;
  for (let i = 0; i < got.length; i++) {
    worst = Math.max(worst, Math.abs(got[i] - want[i]) / entry.steps[Math.floor(i / plane)]);
  }
  return worst;
};

test('the resize, crop and normalisation reproduce Python bit for bit (every image, rule, filter)', () => {
  assert.ok(index.preprocess.length >= 20);
  for (const entry of index.preprocess) {
    const pre = Preprocess.fromManifest(manifest, entry.case);
    const { data, dims } = pre.tensor(rgb(entry.image));
    assert.deepEqual(dims, entry.dims, `${entry.image} ${JSON.stringify(entry.case)}`);
    assert.equal(maxAbs(data, f32(entry.file)), 0, `${entry.image} ${JSON.stringify(entry.case)}`);
  }
});

test('PNG decoded in Node (pngjs, alpha and palette transparency on white) gives the same tensor', async () => {
  const pngs = index.images.filter((n) => n.endsWith('.png'));
  assert.ok(pngs.includes('present-alpha.png') && pngs.includes('hopper-palette.png'));
  for (const entry of index.preprocess.filter((e) => e.image.endsWith('.png'))) {
    const pre = Preprocess.fromManifest(manifest, entry.case);
    const { data } = pre.tensor(await decodeImage(path.join(IMAGES, entry.image)));
    assert.equal(maxAbs(data, f32(entry.file)), 0, `${entry.image} ${JSON.stringify(entry.case)}`);
  }
});

test('JPEG decoded in Node (jpeg-js, EXIF orientation applied) stays near Pillow (libjpeg-turbo)', async () => {
  for (const entry of index.preprocess.filter((e) => e.image.endsWith('.jpg'))) {
    const pre = Preprocess.fromManifest(manifest, entry.case);
    const { data, dims } = pre.tensor(await decodeImage(path.join(IMAGES, entry.image)));
    assert.deepEqual(dims, entry.dims, `${entry.image}: orientation`);
    // jpeg-js upsamples chroma without libjpeg's "fancy" filter: a decoder difference, not
    // a preprocessing one (the bit-exact test above feeds Pillow's decoded pixels)
    const s = steps(data, f32(entry.file), entry);
    assert.ok(s > 0 && s < 40, `${entry.image} ${JSON.stringify(entry.case)}: ${s} steps`);
  }
});

test("Python's round() halves to even in the size arithmetic", () => {
  assert.deepEqual([0.5, 1.5, 2.5, 3.5, 2.4999, 7.5000001].map(pyRound), [0, 2, 2, 4, 2, 8]);
  // 300x199 under patch_multiple at 224 (patch 8): 199 -> 224, 300 * 224/199 / 8 = 42.21...
  const pre = Preprocess.fromManifest(manifest, { resolution: 224, resize: 'patch_multiple' });
  assert.deepEqual(pre.targetSize(300, 199), [224, 336]);
  // a centre crop covers the target: 75x50 to 48x64 scales by max(0.96, 0.853) to 72x48
  const crop = Preprocess.fromManifest(manifest, { resolution: [48, 64] });
  assert.deepEqual(crop.plan(75, 50), { target: [48, 64], resized: [48, 72] });
});

test('sizes a rule would blow up are refused before resizing, saying what and why', () => {
  const pre = Preprocess.fromManifest(manifest, { resolution: 224, resize: 'patch_multiple' });
  assert.throws(() => pre.plan(40000, 1), (e) => e instanceof ImageError &&
    /a 40000x1 image becomes a 8960000x224 input under the 'patch_multiple' rule; expected sides of at most 16384/.test(e.message));
  assert.throws(() => pre.tensor({ data: new Uint8Array(5), width: 2, height: 1 }),
    /expected pixels \{ data, width, height \} with 3 or 4 bytes a pixel, got 5 bytes for 2x1/);
});

test('bad manifests are refused with what was expected and what was given', () => {
  const m = JSON.parse(fs.readFileSync(path.join(DIR, 'bundle', 'manifest.json'), 'utf8'));
  const broken = (change) => { const c = structuredClone(m); change(c); return c; };
  assert.throws(() => readManifest(broken((c) => { c.format_version = 9; })),
    (e) => e instanceof BundleError && /format must be "vit-deploy-bundle" up to v2, got "vit-deploy-bundle v9"/.test(e.message));
  assert.throws(() => readManifest(broken((c) => { c.preprocess.std = [0.2, 0, 0.2]; })),
    /preprocess.std must be 3 finite numbers from 0.000001 to 10000, got \[0.2,0,0.2\]/);
  assert.throws(() => readManifest(broken((c) => { c.preprocess.resolution = [50, 64]; })),
    /preprocess.resolution must be \[height, width\], multiples of the patch size 8/);
  assert.throws(() => readManifest(broken((c) => { c.labels = ['a']; })),
    /labels must be null or 10 strings/);
});

test('images Node cannot decode are refused by name', async () => {
  await assert.rejects(decodeImage(path.join(IMAGES, 'missing.png')), (e) => e instanceof ImageError &&
    e.message.includes('missing.png') && e.message.includes('ENOENT'));
  await assert.rejects(decodeImage(new Uint8Array([1, 2, 3, 4])), /is not a PNG or JPEG/);
  const png = fs.readFileSync(path.join(IMAGES, 'hopper-small.png'));
  await assert.rejects(decodeImage(png.subarray(0, 200)), /could not be decoded/);
});
