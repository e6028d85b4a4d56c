// Issue 24 in JavaScript, the module trusts nothing it reads (as the Python runtime):
// file names stay inside the bundle, labels match the model's real width, every output keeps
// the batch, NaN/Inf outputs are errors, and preprocessing numbers stay within bounds.
// The hostile graphs are written by tests/runtime/test_untrusted_bundle.py (run as a script).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { before, test } from 'node:test';

import {
  BundleError, bundleFile, checkNormalization, NaFlex, OutputError, Preprocess, readManifest, ViT,
} from '../src/vit-deploy.mjs';
import { DIR, IMAGES } from '../testing/fixtures.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const SOURCE = path.join(DIR, 'bundle');
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'vit-deploy-untrusted-'));
const HOSTILE = path.join(TMP, 'hostile');
const IMAGE = path.join(IMAGES, 'hopper-small.png');
const manifestOf = (dir) => JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'));

before(() => {
  const python = process.env.VIT_DEPLOY_PYTHON ?? path.join(root, '.venv', 'bin', 'python');
  const r = spawnSync(python, [path.join(root, 'tests', 'runtime', 'test_untrusted_bundle.py'),
    SOURCE, HOSTILE], { stdio: 'inherit' });
  if (r.status !== 0) throw new Error(`${python} tests/runtime/test_untrusted_bundle.py failed (${r.status ?? r.error})`);
});

let copies = 0;
/** A copy of the fixture bundle, its manifest edited by `change(m)`. */
function copy(change = null, src = SOURCE) {
  const dir = path.join(TMP, `b${copies++}`);
  fs.cpSync(src, dir, { recursive: true });
  if (change) {
    const m = manifestOf(dir);
    change(m);
    fs.writeFileSync(path.join(dir, 'manifest.json'), JSON.stringify(m));
  }
  return dir;
}

// -- 1. paths ---------------------------------------------------------------------------------
const BAD_NAMES = ['/etc/passwd', '../bundle/model.onnx', 'a/../../model.onnx', '..',
  'https://example.com/model.onnx', 'http://127.0.0.1:1/model.onnx', '//example.com/model.onnx',
  'file:///etc/passwd', 'data:application/octet-stream;base64,AAAA', '%2e%2e/model.onnx',
  'sub/%2E%2E/../model.onnx', 'a\\..\\b.onnx', '', 'model.onnx?x=1', 'model.onnx#x', 'x\0.onnx',
  42, null];

test('bundleFile refuses every name that is not a relative path inside the bundle', async () => {
  const base = pathToFileURL(`${SOURCE}/`);
  for (const name of BAD_NAMES) {
    await assert.rejects(bundleFile(base, name), (e) => e instanceof BundleError &&
      /relative path inside the bundle/.test(e.message), String(name));
  }
  for (const web of [new URL('https://site.example/app/bundle/'), new URL('http://localhost:8000/b/')]) {
    for (const name of BAD_NAMES) {
      await assert.rejects(bundleFile(web, name), BundleError, String(name));
    }
    assert.equal((await bundleFile(web, 'sub/model.int8.onnx')).href, `${web.href}sub/model.int8.onnx`);
  }
  assert.equal((await bundleFile(base, 'model.onnx')).href, `${base.href}model.onnx`);
});

test('a manifest naming a model outside the bundle (or an absolute URL) is refused before any fetch', async () => {
  for (const name of BAD_NAMES.filter((n) => typeof n === 'string' && n)) {
    const dir = copy((m) => {
      m.models.fp32 = name;
      m.files[name] = m.files['model.onnx'];
    });
    await assert.rejects(ViT.load(dir, { threads: 1 }), (e) => e instanceof BundleError &&
      /models\["fp32"\] must be a relative path inside the bundle/.test(e.message), name);
  }
  const unlisted = copy((m) => { m.models.fp32 = 'other.onnx'; });
  fs.copyFileSync(path.join(unlisted, 'model.onnx'), path.join(unlisted, 'other.onnx'));
  await assert.rejects(ViT.load(unlisted), /listed under files/);
});

/** Ways for the bundle's `name` to lead outside it (a symlink), by a function each. */
function outsideLinks(dir, name) {
  const outside = fs.mkdtempSync(path.join(TMP, 'outside-'));
  fs.copyFileSync(path.join(SOURCE, 'model.onnx'), path.join(outside, 'real.onnx')); // it would load
  const file = path.join(dir, name);
  return {
    systemFile: () => fs.symlinkSync('/etc/passwd', file),
    validModel: () => fs.symlinkSync(path.join(outside, 'real.onnx'), file),
    relative: () => fs.symlinkSync(path.relative(path.dirname(file), path.join(outside, 'real.onnx')), file),
    chain: () => {
      fs.symlinkSync(path.join(outside, 'real.onnx'), path.join(dir, 'hop'));
      fs.symlinkSync(path.join(dir, 'hop'), file);
    },
    directory: () => {
      fs.mkdirSync(path.join(outside, 'dir'));
      fs.copyFileSync(path.join(outside, 'real.onnx'), path.join(outside, 'dir', path.basename(name)));
      fs.rmSync(path.dirname(file), { recursive: true, force: true });
      fs.symlinkSync(path.join(outside, 'dir'), path.dirname(file));
    },
  };
}

test('a model file that is a symlink leaving the bundle is refused (5 kinds of link)', async () => {
  for (const kind of ['systemFile', 'validModel', 'relative', 'chain', 'directory']) {
    const sub = kind === 'directory';
    const name = sub ? 'sub/model.onnx' : 'model.onnx';
    const dir = copy((m) => {
      m.models = { fp32: name };
      if (sub) m.files[name] = m.files['model.onnx'];
    });
    if (sub) {
      fs.mkdirSync(path.join(dir, 'sub'));
      fs.copyFileSync(path.join(dir, 'model.onnx'), path.join(dir, name));
      const vit = await ViT.load(dir, { threads: 1 }); // the honest layout loads
      await vit.release();
    }
    const make = outsideLinks(dir, name)[kind];
    fs.rmSync(path.join(dir, name));
    make();
    await assert.rejects(ViT.load(dir, { threads: 1 }), (e) => e instanceof BundleError &&
      /outside the bundle/.test(e.message), kind);
  }
});

test('a FIFO or a device in place of a bundle file, an image or a model is refused at once, never read', {
  timeout: 60_000, // a blocking open of the FIFO would hang here (it did) until this fails it
}, async () => {
  const fifo = (file) => {
    fs.rmSync(file);
    const r = spawnSync('mkfifo', [file]);
    assert.equal(r.status, 0, `mkfifo ${file}: ${r.stderr}`);
  };
  for (const name of ['manifest.json', 'model.onnx']) {
    const dir = copy(() => {});
    fifo(path.join(dir, name));
    await assert.rejects(ViT.load(dir, { threads: 1, verify: false }), (e) => e instanceof BundleError &&
      e.message.includes('is a FIFO (named pipe), not a file; refused'), name);
  }
  const device = copy(() => {});
  fs.rmSync(path.join(device, 'model.onnx'));
  fs.symlinkSync('/dev/zero', path.join(device, 'model.onnx'));
  await assert.rejects(ViT.load(device, { threads: 1, verify: false }), (e) => e instanceof BundleError &&
    /is a character device, not a file|outside the bundle/.test(e.message));
  const dir = copy(() => {});
  const vit = await ViT.load(dir, { threads: 1 });
  const image = path.join(TMP, 'image-fifo.png');
  fs.copyFileSync(IMAGE, image);
  fifo(image);
  for (const src of [image, '/dev/zero']) {
    await assert.rejects(vit.classify(src), (e) => e.name === 'ImageError' &&
      /is a (FIFO \(named pipe\)|character device), not a file; refused/.test(e.message), src);
  }
  await vit.release();
  const naflex = path.join(TMP, 'naflex-fifo');
  fs.mkdirSync(naflex);
  fs.closeSync(fs.openSync(path.join(naflex, 'model.onnx'), 'w'));
  fifo(path.join(naflex, 'model.onnx'));
  await assert.rejects(NaFlex.load(naflex, { threads: 1 }), (e) => e instanceof BundleError &&
    e.message.includes('is a FIFO (named pipe), not a file; refused'));
});

test("web.json's external data names go through the same rule", async () => {
  for (const name of ['../model.onnx.data', '/etc/passwd', 'https://example.com/w.data', '%2e%2e/x']) {
    const dir = copy();
    fs.writeFileSync(path.join(dir, 'web.json'), JSON.stringify({ external_data: { fp32: [name] } }));
    await assert.rejects(ViT.load(dir, { threads: 1 }), (e) => e instanceof BundleError &&
      /external data .*relative path inside the bundle/.test(e.message), name);
  }
});

// -- 2. claims against the model --------------------------------------------------------------
test('labels are checked against the graph\'s output width at load, not the manifest\'s claim', async () => {
  for (const n of [1, 5, 9, 11]) {
    const dir = copy((m) => {
      m.config.num_classes = n;
      m.io.outputs[0].shape = ['batch', n];
      m.labels = Array.from({ length: n }, (_, i) => `c${i}`);
    });
    await assert.rejects(ViT.load(dir, { threads: 1 }), (e) => e instanceof BundleError &&
      new RegExp(`${n} labels, but the model's output "logits" .* has 10 classes`).test(e.message), String(n));
  }
});

test('labels are checked at classify() when the graph leaves the width open', async () => {
  const vit = await ViT.load(path.join(HOSTILE, 'symbolic-5'), { threads: 1 });
  await assert.rejects(vit.classify(IMAGE), (e) => e instanceof BundleError &&
    /5 labels, .* has 10 classes/.test(e.message));
  await vit.release();
});

test('a graph that does not keep the batch is an error, not a mix of rows', async () => {
  const vit = await ViT.load(path.join(HOSTILE, 'collapse'), { threads: 1 });
  assert.equal((await vit.run(new Float32Array(3 * 32 * 32), [1, 3, 32, 32])).length, 10);
  for (const batch of [2, 3]) {
    await assert.rejects(vit.run(new Float32Array(batch * 3 * 32 * 32), [batch, 3, 32, 32]),
      (e) => e instanceof BundleError &&
        new RegExp(`dims \\[1,10\\] for a batch of ${batch} .*does not keep the batch`).test(e.message));
  }
  await vit.release();
});

test('NaN or Inf logits are an OutputError from classify(), never probabilities', async () => {
  for (const kind of ['nan', 'inf']) {
    const vit = await ViT.load(path.join(HOSTILE, kind), { threads: 1 });
    const raw = await vit.run(new Float32Array(3 * 32 * 32), [1, 3, 32, 32]); // raw: as computed
    assert.ok(raw.some((v) => !Number.isFinite(v)));
    await assert.rejects(vit.classify(IMAGE), (e) => e instanceof OutputError &&
      /"logits" holds 10 NaN\/Inf value/.test(e.message), kind);
    await vit.release();
  }
});

// -- 3. numbers that become arithmetic --------------------------------------------------------
const ABSURD = [['mean', [1e300, 0, 0]], ['mean', [-1e300, 0, 0]], ['mean', [0, 0, 1e5]],
  ['std', [1e300, 1, 1]], ['std', [1, 1, 1e5]], ['std', [1e-7, 1, 1]], ['std', [0, 1, 1]],
  ['std', [-0.5, 1, 1]], ['std', [5e-324, 1, 1]], ['scale', 1e300], ['scale', 1e-300],
  ['scale', 0], ['scale', -1 / 255], ['scale', 1e4], ['scale', null], ['scale', '0.5'],
  ['mean', [0.5, 0.5]], ['std', '0.5'], ['mean', [NaN, 0, 0]], ['std', [Infinity, 1, 1]]];

test('absurd preprocessing numbers in a manifest are refused (20 cases), the bounds accepted', () => {
  const valid = manifestOf(SOURCE);
  for (const [key, value] of ABSURD) {
    const m = structuredClone(valid);
    m.preprocess[key] = value;
    assert.throws(() => readManifest(m), (e) => e instanceof BundleError &&
      new RegExp(`preprocess\\.${key}.* must|must .*preprocess\\.${key}`).test(e.message), `${key} ${value}`);
  }
  for (const [key, value] of [['mean', [1e4, -1e4, 0]], ['std', [1e-6, 1e4, 1]], ['scale', 1e3],
    ['scale', 1e-6], ['scale', 1]]) {
    const m = structuredClone(valid);
    m.preprocess[key] = value;
    assert.ok(readManifest(m).preprocess, `${key} ${value}`);
  }
});

test('Preprocess and classify() overrides are held to the same bounds', async () => {
  const fields = { resolution: [32, 32], patchSize: 8, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5] };
  for (const [key, value] of ABSURD.filter(([, v]) => v !== null)) {
    assert.throws(() => new Preprocess({ ...fields, [key]: value }), new RegExp(key), `${key} ${value}`);
  }
  for (const [key, value] of [['resolution', [0, 32]], ['resolution', [32, 1e6]], ['patchSize', 0],
    ['patchSize', -8], ['patchSize', 8.5], ['patchSize', undefined]]) {
    assert.throws(() => new Preprocess({ ...fields, [key]: value }), new RegExp(key), `${key} ${value}`);
  }
  assert.throws(() => checkNormalization([0.5], [0.5, 0.5]), /as many values/);
  const vit = await ViT.load(SOURCE, { threads: 1 });
  for (const overrides of [{ std: [0, 0, 0] }, { mean: [NaN, 0, 0] }, { mean: [1e300, 0, 0] },
    { scale: 1e300 }]) {
    await assert.rejects(vit.classify(IMAGE, overrides), /must be/, JSON.stringify(overrides));
  }
  await vit.release();
});

// As tests/runtime/test_embedding.py::test_a_lying_purpose_is_one_line_error, on the fixture
// classifier (outputs logits and, where exported so, pooled)
test('the manifest\'s purpose is read, and a lying one is refused naming the field', async () => {
  const valid = manifestOf(SOURCE);
  const read = readManifest(valid).purpose;
  assert.equal(read.classifier, 'logits');
  assert.ok(['classifier', 'classifier+embedding'].includes(read.kind), read.kind);
  const old = structuredClone(valid);
  delete old.purpose; // a bundle written before the field: read from the outputs
  assert.deepEqual(readManifest(old).purpose, read);
  for (const [purpose, field] of [
    [[1, 2], 'purpose\\. must be an object'], [{ classifier: 'scores' }, 'purpose\\.classifier'],
    [{ classifier: ['logits'] }, 'purpose\\.classifier'], [{ embedding: 'pooled' }, 'purpose\\.embedding must'],
    [{ embedding: { output: 'logits' } }, null], [{ embedding: { output: { a: 1 } } }, 'purpose\\.embedding\\.output'],
    [{ embedding: { output: 'logits', dim: 1e9 } }, 'purpose\\.embedding\\.dim'],
    [{ embedding: { output: 'logits', normalised: 'yes' } }, 'purpose\\.embedding\\.normalised'],
    [{ embedding: { output: 'logits', similarity: ['cosine'] } }, 'purpose\\.embedding\\.similarity'],
  ]) {
    const m = structuredClone(valid);
    m.purpose = purpose;
    if (field === null) { // logits is (batch, classes): a vector per image, accepted
      assert.equal(readManifest(m).purpose.embedding, 'logits');
      continue;
    }
    assert.throws(() => readManifest(m), (e) => e instanceof BundleError && new RegExp(field).test(e.message),
      JSON.stringify(purpose));
  }
  // the purpose decides: a classifier whose manifest says it only embeds is not asked to classify
  const dir = copy((m) => { m.purpose = { classifier: null, embedding: { output: 'logits', similarity: 'dot' } }; });
  const vit = await ViT.load(dir, { threads: 1 });
  await assert.rejects(vit.classify(IMAGE), /a backbone without a classifier; use embed\(\)/);
  const e = await vit.embed(IMAGE);
  assert.equal(e.output, 'logits');
  assert.equal(e.similarity, 'dot');
  await vit.release();
});

// As tests/runtime/test_manifest.py::test_a_list_or_object_in_place_of_any_name_is_a_bundle_error_not_a_type_error
test('a list or an object in place of a file name is a BundleError, never a TypeError', () => {
  const valid = manifestOf(SOURCE);
  const places = [['models', 'fp32'], ['references', 'file'], ['io', 'inputs', 0, 'name'],
    ['io', 'outputs', 0, 'name'], ['preprocess', 'resize'], ['preprocess', 'interpolation']];
  let tried = 0;
  for (const place of places) {
    for (const value of [['model.onnx'], { 'model.onnx': 1 }, [1, 2]]) {
      const m = structuredClone(valid);
      let at = m;
      for (const key of place.slice(0, -1)) at = at[key];
      if (at === undefined || at === null) continue;
      at[place.at(-1)] = value;
      assert.throws(() => readManifest(m), (e) => e instanceof BundleError, `${place.join('.')} = ${JSON.stringify(value)}`);
      tried += 1;
    }
  }
  assert.ok(tried >= 15, `${tried} cases`);
});
