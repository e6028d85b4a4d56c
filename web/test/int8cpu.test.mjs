// int8 and the CPU in JavaScript, as vit_deploy/runtime/cpu.py: which recipe a manifest
// records, which CPUs run 8-bit weights exactly, and the warning ViT.load gives in Node.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { exactInt8, int8Cpu, int8Recipe, int8Warning, readManifest, ViT } from '../src/vit-deploy.mjs';
import { DIR } from '../testing/fixtures.mjs';

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

test('ViT.load reports the warning where the CPU lacks what the file needs', async () => {
  const bundle = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-int8cpu-'));
  fs.cpSync(path.join(DIR, 'bundle'), bundle, { recursive: true });
  const file = path.join(bundle, 'manifest.json');
  const manifest = JSON.parse(fs.readFileSync(file, 'utf8'));
  assert.equal(readManifest(manifest).int8Cpu.int8, 'any'); // what quantize writes by default
  manifest.precisions.int8.recipe.cpu = 'vnni';
  fs.writeFileSync(file, JSON.stringify(manifest));
  const vit = await ViT.load(bundle, { precision: 'int8', threads: 1 });
  const here = fs.readFileSync('/proc/cpuinfo', 'utf8');
  const flags = here.split('\n').find((l) => l.startsWith('flags')).split(':')[1].trim().split(/\s+/);
  assert.equal(vit.info.cpuWarning === null, exactInt8(process.arch, flags) === true);
  const fp32 = await ViT.load(bundle, { precision: 'fp32', threads: 1 });
  assert.equal(fp32.info.cpuWarning, null);
});
