// int8 and the CPU in JavaScript, as vit_deploy/runtime/cpu.py: which recipe a manifest
// records, which CPUs run 8-bit weights exactly, and the warning ViT.load gives in Node.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { exactInt8, int8Cpu, int8Recipe, int8Warning, readManifest, ViT } from '../src/vit-deploy.mjs';
import { batchCoupled, int8WeightsNeed } from '../src/lib/onnx-metadata.mjs';
import { modelReader } from '../src/lib/platform-node.mjs';
import { DIR, index } from '../testing/fixtures.mjs';

// /proc/cpuinfo flags (abridged), as in tests/test_int8_cpu.py
const CPUS = {
  'amd-epyc-avx2': ['x64', 'sse4_2 avx avx2 fma bmi2', false],
  'intel-xeon-amx': ['x64', 'avx2 avx512f avx512_vnni avx_vnni amx_int8', true],
  'amd-zen4': ['x64', 'avx2 avx512f avx512_vnni', true],
  'intel-alder-lake': ['x64', 'avx2 avx_vnni', true],
  'old-x86-sse': ['x64', 'sse4_1 sse4_2', true],
  'raspberry-pi-5': ['arm64', 'fp asimd asimddp', true],
};

for (const [name, [arch, flags, exact]] of Object.entries(CPUS)) {
  test(`8-bit int8 weights on ${name}`, async () => {
    assert.equal(exactInt8(arch, flags.split(' ')), exact);
    const warning = await int8Warning('vnni', { node: true, arch, flags: flags.split(' ') });
    assert.equal(warning === null, exact, warning);
    if (!exact) assert.match(warning, /saturates: expect wrong outputs/);
    assert.equal(await int8Warning('any', { node: true, arch, flags: flags.split(' ') }), null);
  });
}

test('a CPU that does not list its features, the browser, and non-int8 precisions', async () => {
  assert.match(await int8Warning('vnni', { node: true, arch: 'x64', flags: null }), /cannot tell/);
  assert.equal(await int8Warning('vnni', { node: false, arch: 'x64', flags: [] }), null);
  assert.equal(await int8Warning(null, { node: true, arch: 'x64', flags: ['avx2'] }), null);
});

test('the recipe the manifest records, old files included', () => {
  const m = (recipe) => ({ precisions: { int8: { recipe } } });
  assert.equal(int8Cpu(m({ kind: 'dynamic', cpu: 'any', reduce_range: true }), 'int8'), 'any');
  assert.equal(int8Cpu(m({ kind: 'static QDQ', cpu: 'vnni' }), 'int8'), 'vnni');
  assert.equal(int8Cpu(m({ kind: 'dynamic', reduce_range: false }), 'int8'), 'vnni');
  assert.equal(int8Cpu(m({ kind: 'dynamic', reduce_range: true }), 'int8'), 'any');
  assert.equal(int8Cpu(m({ kind: 'dynamic', cpu: 'avx9' }), 'int8'), 'vnni');
  assert.equal(int8Cpu(m({ kind: 'weight-only MatMulNBits' }), 'int8'), null);
  assert.equal(int8Cpu({}, 'fp32'), null);
});

// One table for both runtimes: Python's Int8Recipe.read runs it in tests/test_int8_cpu.py
const RECIPES = JSON.parse(fs.readFileSync(
  path.join(import.meta.dirname, '..', '..', 'tests', 'data', 'int8-recipes.json'), 'utf8'));

for (const { name, recipe, expect } of RECIPES.cases) {
  test(`the typed int8 recipe, as Python reads it: ${name}`, () => {
    const got = int8Recipe({ precisions: { p: { recipe } } }, 'p');
    const want = expect && {
      kind: expect.kind, cpu: expect.cpu, calibration: expect.calibration,
      percentile: expect.percentile, smoothing: expect.smoothing,
      quantisedLayers: expect.quantised_layers, keptFloatLayers: expect.kept_float_layers,
      needs: expect.needs, newGraphCpu: expect.new_graph_cpu,
    };
    assert.deepEqual(got, want);
    assert.equal(int8Cpu({ precisions: { p: { recipe } } }, 'p'), expect?.needs ?? null);
  });
}

test('ViT.load: where the CPU could saturate, the file\'s weights decide, not the recipe', async () => {
  const bundle = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-int8cpu-'));
  fs.cpSync(path.join(DIR, 'bundle'), bundle, { recursive: true });
  const file = path.join(bundle, 'manifest.json');
  const manifest = JSON.parse(fs.readFileSync(file, 'utf8'));
  assert.equal(readManifest(manifest).int8Cpu.int8, 'any'); // what quantize writes by default
  manifest.precisions.int8.recipe.cpu = 'vnni'; // a claim the file's 7-bit weights do not need
  fs.writeFileSync(file, JSON.stringify(manifest));
  const vit = await ViT.load(bundle, { precision: 'int8', threads: 1 });
  assert.equal(vit.info.cpuWarning, null); // on every CPU: the weights fit in 7 bits
  const fp32 = await ViT.load(bundle, { precision: 'fp32', threads: 1 });
  assert.equal(fp32.info.cpuWarning, null);
  fs.rmSync(bundle, { recursive: true, force: true });
});

// Python read these files (tests/website/test_web.py _int8_files); Node must read them the same
for (const [name, { need, coupled }] of Object.entries(index.int8_weights_need)) {
  test(`what the int8 weights of ${name} need, and whether it couples a batch, as Python reads it`, async () => {
    assert.equal(await int8WeightsNeed(await modelReader(path.join(DIR, name))), need);
    assert.equal(await batchCoupled(await modelReader(path.join(DIR, name)), 'unread'), coupled);
  });
}

test('ViT.load splits a batch by what the file computes, not the recipe\'s kind', async () => {
  const bundle = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-coupled-'));
  fs.cpSync(path.join(DIR, 'bundle'), bundle, { recursive: true });
  const file = path.join(bundle, 'manifest.json');
  const manifest = JSON.parse(fs.readFileSync(file, 'utf8'));
  manifest.precisions.int8.recipe.kind = 'static QDQ'; // the file is dynamic int8
  fs.writeFileSync(file, JSON.stringify(manifest));
  assert.equal((await ViT.load(bundle, { precision: 'int8', threads: 1 })).info.splitBatches, true);
  assert.equal((await ViT.load(bundle, { precision: 'fp32', threads: 1 })).info.splitBatches, false);
  fs.rmSync(bundle, { recursive: true, force: true });
});

test('the file decides over the recipe, asked only where the CPU could saturate', async () => {
  const avx2 = { node: true, arch: 'x64', flags: ['avx2'] };
  const asked = [];
  const file = (need) => async () => { asked.push(need); return need; };
  assert.match(await int8Warning('any', avx2, file('vnni')), /saturates: expect wrong outputs/);
  assert.equal(await int8Warning('vnni', avx2, file('any')), null);
  assert.match(await int8Warning('vnni', avx2, file(null)), /saturates/); // no int8 weights read
  assert.match(await int8Warning('any', { ...avx2, flags: null }, file('vnni')), /cannot tell/);
  assert.deepEqual(asked, ['vnni', 'any', null, 'vnni']);
  // exact CPUs, the browser and non-int8 precisions never read the file
  assert.equal(await int8Warning('vnni', { node: true, arch: 'x64', flags: ['avx512_vnni'] }, file('x')), null);
  assert.equal(await int8Warning('vnni', { node: true, arch: 'arm64', flags: [] }, file('x')), null);
  assert.equal(await int8Warning('vnni', { node: false, arch: 'x64', flags: ['avx2'] }, file('x')), null);
  assert.equal(await int8Warning(null, avx2, file('x')), null);
  assert.equal(asked.length, 4);
});

test('int8WeightsNeed on hand-built bytes: packed int32_data, no graph, broken bytes', async () => {
  const bytesReader = (b) => ({ size: b.length, read: async (at, n) => b.subarray(at, at + n) });
  const varint = (v) => { const o = []; do { o.push((v & 0x7f) | (v > 0x7f ? 0x80 : 0)); v >>>= 7; } while (v); return o; };
  const field = (n, bytes) => [...varint(n * 8 + 2), ...varint(bytes.length), ...bytes];
  const tensor = (type, values) => [...field(1, [...varint(2), ...varint(values.length / 2)]),
    ...varint(2 * 8), ...varint(type), ...field(5, values.flatMap((v) => varint(v)))];
  const model = (t) => new Uint8Array(field(7, field(5, t)));
  assert.equal(await int8WeightsNeed(bytesReader(model(tensor(3, [1, 2, 64, 3])))), 'any');
  assert.equal(await int8WeightsNeed(bytesReader(model(tensor(3, [1, 2, 100, 3])))), 'vnni');
  assert.equal(await int8WeightsNeed(bytesReader(model(tensor(1, [1, 2, 100, 3])))), null); // float
  assert.equal(await int8WeightsNeed(bytesReader(new Uint8Array([8, 7]))), null); // no graph
  assert.equal(await int8WeightsNeed(bytesReader(new Uint8Array([0x3a, 0x7f, 1]))), null); // broken
});
