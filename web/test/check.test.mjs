// vit.check() in Node: the golden references a bundle carries (PyTorch fp32 outputs of
// seeded inputs) against onnxruntime-node, judged by the tolerance policy, in the report
// every runtime writes (schema "vit-deploy-report" v1).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { BundleError, compare, COSINE_MIN, FP32_ABS_TOL, mergeReports, pixelInput, seededInput,
  toleranceClass, ViT } from '../src/vit-deploy.mjs';
import { DIR, index } from '../testing/fixtures.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const TABLE = JSON.parse(fs.readFileSync(path.join(root, 'tests', 'data', 'mulberry32.json'), 'utf8'));
const references = (bundle) => JSON.parse(fs.readFileSync(path.join(DIR, bundle, 'manifest.json'), 'utf8')).references;

test('the seeded generator gives the shared table\'s float32 values, byte for byte', () => {
  assert.equal(TABLE.generator, 'mulberry32-uniform-v1');
  const got = seededInput(TABLE.seed, TABLE.shape);
  assert.deepEqual(new Uint8Array(got.buffer), new Uint8Array(Float32Array.from(TABLE.values).buffer));
  const big = seededInput(7, [2, 3, 64, 64]);
  assert.ok(big.every((v) => v >= -2 && v < 2));
  assert.ok(Math.abs(big.reduce((a, b) => a + b, 0) / big.length) < 0.05); // uniform, centred
  assert.throws(() => seededInput(-1, [1]), /seed must be an integer from 0 to 2\^32-1, got -1/);
});

test('a real-photograph case\'s input is Python\'s, byte for byte', () => {
  const refs = references('bundle');
  const [photo] = refs.cases.filter((c) => c.pixels);
  assert.ok(photo && photo.name === 'photos' && photo.seed === 0, JSON.stringify(refs.cases));
  const bytes = new Uint8Array(fs.readFileSync(path.join(DIR, 'bundle', refs.file)));
  const got = pixelInput(bytes, photo.pixels, photo.shape);
  const want = fs.readFileSync(path.join(DIR, index.photo_input));
  assert.equal(got.length, photo.shape.reduce((a, b) => a * b, 1));
  assert.deepEqual(Buffer.from(got.buffer), want);
  assert.throws(() => pixelInput(bytes.subarray(0, 8), photo.pixels, photo.shape),
    /reference pixels end at byte \d+, the file has 8/);
});

test('check() passes every case and output of the references, fp32 and int8, with latency', async () => {
  for (const [bundle, precision] of [['bundle', 'fp32'], ['bundle', 'int8'], ['bundle-dense', 'fp32']]) {
    const vit = await ViT.load(path.join(DIR, bundle), { precision, threads: 1 });
    const report = await vit.check({ latencyRuns: 3 });
    await vit.release();
    const what = `${bundle} ${precision}`;
    assert.equal(report.schema, 'vit-deploy-report');
    assert.equal(report.schema_version, 1);
    assert.equal(report.kind, 'check');
    assert.equal(report.bundle, path.join(DIR, bundle));
    assert.match(report.device.runtime, /^onnxruntime-node 1\.30\.0$/);
    assert.match(report.reference, /^golden references \(pytorch fp32, torch \d/);
    assert.equal(report.passed, true, `${what}: ${JSON.stringify(report.cases)}`);
    const refs = references(bundle);
    assert.deepEqual(report.cases.map((c) => [c.label, c.output]),
      refs.cases.flatMap((c) => Object.keys(c.outputs).map((o) => [c.name, o])), what);
    for (const c of report.cases) {
      assert.equal(c.provider, 'cpu');
      assert.equal(c.precision, precision);
      assert.equal(c.batch, 2);
      assert.equal(c.cosine_min, COSINE_MIN[toleranceClass(precision)]);
      if (precision === 'fp32') assert.ok(c.max_abs <= 1e-5 && c.abs_tol >= FP32_ABS_TOL, `${what} ${c.label}`);
      else assert.equal(c.abs_tol, null);
    }
    assert.deepEqual(report.latency.map((l) => [l.provider, l.precision, l.runs, l.batch]),
      [['cpu', precision, 3, 2]]);
    assert.deepEqual(report.latency[0].resolution, refs.cases[0].shape.slice(2));
    assert.ok(report.latency[0].p50_ms > 0 && report.latency[0].p90_ms >= report.latency[0].p50_ms);
    JSON.parse(JSON.stringify(report)); // plain JSON
  }
});

test('check() gives Python\'s figures (check --reference bundle --json), case by case: int8 batches image by image, the worst image\'s cosine', async () => {
  // Python's report (tests/website/test_web.py), written for fp32 and int8 of the same bundle
  const python = JSON.parse(fs.readFileSync(path.join(DIR, index.python_check), 'utf8'));
  assert.equal(python.passed, true);
  const worst = {};
  for (const precision of ['fp32', 'int8']) {
    const vit = await ViT.load(path.join(DIR, 'bundle'), { precision, threads: 1 });
    assert.equal(vit.info.splitBatches, precision === 'int8'); // the int8 recipe is dynamic
    const report = await vit.check();
    await vit.release();
    const want = python.cases.filter((c) => c.precision === precision);
    assert.equal(report.cases.length, want.length, precision);
    assert.ok(want.length >= 3 && want.every((c) => c.batch === 2), JSON.stringify(want));
    worst[precision] = 0;
    report.cases.forEach((c, i) => {
      const w = want[i];
      const what = `${precision} ${c.label} (Python's ${w.label}) ${c.output}`;
      for (const key of ['resolution', 'batch', 'output', 'abs_tol', 'cosine_min', 'passed']) {
        assert.deepEqual(c[key], w[key], `${what}: ${key}`);
      }
      const diff = Math.max(Math.abs(c.max_abs - w.max_abs), Math.abs(c.cosine - w.cosine));
      assert.ok(diff <= 1e-5, `${what}: max |Δ| ${c.max_abs} / cosine ${c.cosine}, Python's ` +
        `${w.max_abs} / ${w.cosine}`);
      worst[precision] = Math.max(worst[precision], diff);
    });
  }
  console.log(`vit.check() vs Python's check --reference bundle: largest difference of a figure ${JSON.stringify(worst)}`);
});

test('compare(): the least cosine of its rows; a zero row against a non-zero one is cosine 0, as Python\'s', () => {
  const ref = Float32Array.from([1, 0, 0, 1]);
  const got = Float32Array.from([1, 0, 1, 1]); // row 0 exact, row 1 at 45°
  assert.equal(compare(got, ref, 'int8', { rows: 2 }).cosine, 1 / Math.sqrt(2));
  assert.ok(Math.abs(compare(got, ref, 'int8').cosine - 2 / Math.sqrt(6)) < 1e-15); // one over all
  assert.equal(compare(Float32Array.from([0, 0, 1, 1]), ref, 'int8', { rows: 2 }).cosine, 0);
  assert.equal(compare(new Float32Array(4), new Float32Array(4), 'fp32', { rows: 2 }).cosine, 1);
  assert.throws(() => compare(got, ref, 'int8', { rows: 3 }), /rows must be a positive integer dividing the 4 values, got 3/);
});

test('the policy: fp32 by max |Δ| and cosine, others by cosine; NaN fails as null', () => {
  const ref = Float32Array.from([1, 2, 3, 4]);
  assert.equal(compare(ref, ref, 'fp32').passed, true);
  const off = Float32Array.from([1, 2, 3, 4.001]);
  assert.equal(compare(off, ref, 'fp32').passed, false); // 1e-3 > 1e-4 · 4
  assert.equal(compare(off, ref, 'int8-static').passed, true);
  assert.equal(compare(off, ref, 'int8-static').cosine_min, 0.99);
  const nan = compare(Float32Array.from([1, NaN, 3, 4]), ref, 'int4');
  assert.deepEqual([nan.passed, nan.max_abs, nan.cosine], [false, null, null]);
  assert.throws(() => toleranceClass('fp64'), /unknown precision "fp64"/);
  const merged = mergeReports([{ device: { gpu: null }, passed: true, cases: [1], latency: [] },
    { device: { gpu: 'x' }, passed: false, cases: [2], latency: [3] }]);
  assert.deepEqual([merged.passed, merged.cases, merged.latency, merged.device.gpu], [false, [1, 2], [3], 'x']);
});

test('a bundle without references, or with broken ones, fails with a BundleError', async (t) => {
  const tmp = fs.mkdtempSync(path.join(DIR, 'refs-'));
  t.after(() => fs.rmSync(tmp, { recursive: true, force: true }));
  fs.cpSync(path.join(DIR, 'bundle'), tmp, { recursive: true });
  const old = JSON.parse(fs.readFileSync(path.join(tmp, 'manifest.json'), 'utf8'));
  const { references: _, ...without } = old; // a bundle written before references existed
  const { 'references.bin': __, ...files } = without.files;
  fs.writeFileSync(path.join(tmp, 'manifest.json'), JSON.stringify({ ...without, files }));
  const vit = await ViT.load(tmp, { threads: 1 });
  await assert.rejects(vit.check(), (e) => e instanceof BundleError &&
    /has no golden references \(its manifest has no "references"\)/.test(e.message));
  await vit.release();
  fs.writeFileSync(path.join(tmp, 'manifest.json'), JSON.stringify(old));
  const bin = path.join(tmp, 'references.bin');
  const bytes = fs.readFileSync(bin);
  bytes[0] ^= 1;
  fs.writeFileSync(bin, bytes); // same size, other bytes
  const changed = await ViT.load(tmp, { threads: 1 });
  await assert.rejects(changed.check(), /references .* has sha256 .*, the manifest says .* \(modified after export\)/);
  fs.writeFileSync(bin, bytes.subarray(4));
  await assert.rejects(changed.check(), /has \d+ bytes, the manifest says \d+ \(truncated or replaced\)/);
  await changed.release();
  const manifest = JSON.parse(fs.readFileSync(path.join(tmp, 'manifest.json'), 'utf8'));
  manifest.references.cases[0].outputs.logits.offset = 1 << 20;
  fs.writeFileSync(path.join(tmp, 'manifest.json'), JSON.stringify(manifest));
  await assert.rejects(ViT.load(tmp), (e) => e instanceof BundleError &&
    /references.cases\[0\]: outputs\["logits"\] must be \{offset .* inside the \d+-byte references.bin/.test(e.message));
  manifest.references.cases[0].outputs = { nope: { offset: 0, shape: [2, 10] } };
  fs.writeFileSync(path.join(tmp, 'manifest.json'), JSON.stringify(manifest));
  await assert.rejects(ViT.load(tmp), /outputs\["nope"\] must be one of io.outputs \["logits"\]/);
});
