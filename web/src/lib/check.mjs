// The proof that travels with a bundle, in JavaScript: golden references (PyTorch fp32
// outputs of seeded inputs, references.bin) against what this runtime computes, judged by the
// project's tolerance policy (vit_deploy/runtime/contract.py, tied by
// tests/website/test_web_constants.py), into the report every runtime writes (schema
// "vit-deploy-report" v1: Python's `check --json`, Node's and the page's `vit.check()`).
// A SigLIP 2 NaFlex bundle's references (manifest `naflex_references`: seeded RGB images of
// several aspect ratios, runtime/naflex/references.py) are read and judged here too
// (`naflex.check()`), as Python's check/naflex.py judges them.
import { BundleError, isInt, MAX_SIDE, show } from './common.mjs';

const REFERENCES_ROLE = 'references'; // the role of references.bin under files (manifest.mjs's)

// The tolerance policy, PyTorch fp32 as the reference: fp32 max |Δ| <= FP32_ABS_TOL ·
// max(1, max |ref|) and cosine >= COSINE_MIN.fp32; other precisions by cosine only.
export const FP32_ABS_TOL = 1e-4;
export const COSINE_MIN = Object.freeze({ fp32: 0.99999, fp16: 0.999, int8: 0.99, int4: 0.95 });

export const REPORT_SCHEMA = 'vit-deploy-report';
export const REPORT_SCHEMA_VERSION = 1;
export const GENERATOR = 'mulberry32-uniform-v1';
const NAFLEX_GENERATOR = 'mulberry32-rgb8-v1'; // runtime/naflex/references.py's images
const NAFLEX_MAX_IMAGES = 64; // a case's, as Python's MAX_IMAGES
const NAFLEX_MAX_CASES = 64; // as Python's references.MAX_CASES
const NAFLEX_MAX_VALUES = 2 ** 24; // H x W x 3 over a case's images, as Python's MAX_VALUES

/** The policy a precision is judged by: int8-static as int8 (as Python's tolerance_class). */
export function toleranceClass(precision) {
  const policy = String(precision).split('-')[0];
  if (!Object.hasOwn(COSINE_MIN, policy)) {
    throw new Error(`unknown precision ${show(precision)}; known: ${show(Object.keys(COSINE_MIN))}`);
  }
  return policy;
}

/**
 * The input of a reference case, regenerated from its seed ("mulberry32-uniform-v1"):
 * element i (C order) is mulberry32 with its state advanced i + 1 times, mapped to
 * [-2, 2) in float64 and rounded to float32. Counter-based, as Python's vectorised copy.
 */
export function seededInput(seed, shape) {
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
    throw new Error(`seed must be an integer from 0 to 2^32-1, got ${show(seed)}`);
  }
  const n = shape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const a = (seed + Math.imul(i + 1, 0x6D2B79F5)) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = (((t ^ (t >>> 14)) >>> 0) / 4294967296) * 4 - 2; // rounded once, on store
  }
  return out;
}

/**
 * The input of a real-photograph reference case: uint8 pixels (batch, channels, H, W) stored
 * at `pixels.offset` of the references file, made into the model input as preprocessing makes
 * it, in float32 at every step: (pixels · scale − mean) / std per channel (bit-identical to
 * Python's runtime/references.py and runtime/preprocess.py).
 */
export function pixelInput(bytes, pixels, shape) {
  const [b, c, h, w] = shape;
  const plane = h * w;
  const n = b * c * plane;
  if (pixels.offset + n > bytes.byteLength) {
    throw new Error(`reference pixels end at byte ${pixels.offset + n}, the file has ${bytes.byteLength}`);
  }
  const scale = Math.fround(pixels.scale);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const ch = Math.floor(i / plane) % c;
    const x = Math.fround(bytes[pixels.offset + i] * scale);
    out[i] = Math.fround(x - Math.fround(pixels.mean[ch])) / Math.fround(pixels.std[ch]);
  }
  return out;
}

/** A reference case's input: its stored pixels, else regenerated from its seed. */
export const caseInput = (c, bytes) => (c.pixels ? pixelInput(bytes, c.pixels, c.shape)
  : seededInput(c.seed, c.shape));

const finite = (v) => (Number.isFinite(v) ? v : null); // strict JSON: no NaN / Infinity

/**
 * One output against its golden reference: { max_abs, abs_tol, cosine, cosine_min, passed }
 * (float64 sums; NaN or Inf anywhere fails, written as null). `rows`: the output is that
 * many images' outputs one after another, and the cosine is the least of theirs (Python's
 * parity.metrics); 1 (the default): one cosine over the whole output.
 */
export function compare(got, ref, precision, { rows = 1 } = {}) {
  if (got.length !== ref.length) {
    throw new Error(`output has ${got.length} values, its reference ${ref.length}`);
  }
  if (!isInt(rows, 1) || got.length % rows) {
    throw new Error(`rows must be a positive integer dividing the ${got.length} values, got ${show(rows)}`);
  }
  const policy = toleranceClass(precision);
  const per = got.length / rows;
  let maxAbs = 0; let refMax = 0; let cosine = Infinity;
  for (let r = 0; r < rows; r++) {
    let ab = 0; let aa = 0; let bb = 0;
    for (let i = r * per; i < (r + 1) * per; i++) {
      const a = got[i]; const b = ref[i];
      const d = Math.abs(a - b);
      maxAbs = d > maxAbs || Number.isNaN(d) ? d : maxAbs;
      refMax = Math.max(refMax, Math.abs(b));
      ab += a * b; aa += a * a; bb += b * b;
    }
    // identical vectors (zeros included) agree; a zero vector against a non-zero one does
    // not: cosine 0, as Python's parity.metrics
    const cos = aa === 0 || bb === 0 ? Number(aa === bb) : ab / Math.sqrt(aa * bb);
    cosine = cos < cosine || Number.isNaN(cos) ? cos : cosine;
  }
  const absTol = policy === 'fp32' ? FP32_ABS_TOL * Math.max(1, refMax) : null;
  const cosineMin = COSINE_MIN[policy];
  const passed = Number.isFinite(maxAbs) && Number.isFinite(cosine) && cosine >= cosineMin &&
    (absTol === null || maxAbs <= absTol);
  return { max_abs: finite(maxAbs), abs_tol: finite(absTol), cosine: finite(cosine),
    cosine_min: cosineMin, passed };
}

/** p50 / p90 of latencies in ms (nearest rank). */
export function percentiles(times) {
  const s = [...times].sort((a, b) => a - b);
  const at = (q) => s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
  return { p50_ms: at(0.5), p90_ms: at(0.9) };
}

/** "golden references (pytorch fp32, torch 2.13.0)" from the manifest's source. */
export const referenceName = (source) => `golden references (${source.replace(/ \((.*)\)$/, ', $1')})`;

function checkRuns(latencyRuns) {
  if (!Number.isInteger(latencyRuns) || latencyRuns < 0) {
    throw new Error(`latencyRuns must be a non-negative integer, got ${show(latencyRuns)}`);
  }
}

/** One latency entry: `run` once to warm up (the first run at a size plans it), then
 * `runs` timed runs. */
async function latencyOf(run, runs, entry) {
  await run();
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await run();
    times.push(performance.now() - t);
  }
  return { ...entry, ...percentiles(times), runs };
}

const reportOf = ({ bundle, device, references, cases, latency }) => ({
  schema: REPORT_SCHEMA, schema_version: REPORT_SCHEMA_VERSION, kind: 'check', bundle, device,
  reference: referenceName(references.source),
  passed: cases.length > 0 && cases.every((c) => c.passed), cases, latency,
});

/** The float32 values of a reference output: little-endian at `offset`, `shape` in C order. */
function stored(bytes, { offset, shape }) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const ref = new Float32Array(shape.reduce((a, b) => a * b, 1));
  for (let i = 0; i < ref.length; i++) ref[i] = view.getFloat32(offset + 4 * i, true);
  return ref;
}

/**
 * The check report of a loaded ViT (`vit`) against `references` (the manifest's, read) and
 * their bytes: every case × declared output, as Python's `check --reference bundle`: max |Δ|
 * over the batch, the cosine of its worst image (a bad image cannot hide behind a good one);
 * `vit.runAll` runs a dynamic-int8 batch image by image, as Python. `latencyRuns` timed runs
 * of the first case.
 */
export async function checkReport(vit, references, bytes, { latencyRuns = 0, device, bundle }) {
  checkRuns(latencyRuns);
  const { precision, info } = vit;
  const cases = [];
  for (const c of references.cases) {
    const x = caseInput(c, bytes);
    const names = Object.keys(c.outputs);
    const outputs = await vit.runAll(x, c.shape, names);
    for (const name of names) {
      cases.push({ label: c.name, provider: info.provider, precision,
        resolution: [c.shape[2], c.shape[3]], batch: c.shape[0], output: name,
        ...compare(outputs[name].data, stored(bytes, c.outputs[name]), precision, { rows: c.shape[0] }) });
    }
  }
  const latency = [];
  if (latencyRuns > 0 && references.cases.length) {
    const [first] = references.cases;
    const x = caseInput(first, bytes);
    const name = Object.keys(first.outputs)[0];
    latency.push(await latencyOf(() => vit.runAll(x, first.shape, [name]), latencyRuns, {
      provider: info.provider, precision, resolution: [first.shape[2], first.shape[3]],
      batch: first.shape[0] }));
  }
  return reportOf({ bundle, device, references, cases, latency });
}

/** Hex sha256 of bytes; null where Web Crypto is not offered (a page on plain http that is
 * not localhost: no secure context), the size check then stands alone. */
async function sha256(bytes) {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) return null;
  const hash = new Uint8Array(await subtle.digest('SHA-256', bytes));
  return Array.from(hash, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** A BundleError unless the references file's bytes (read from `url`) have the size and
 * sha256 the manifest lists (`references.size`, `.sha256`). */
export async function verifyReferences(bytes, references, url) {
  if (bytes.byteLength !== references.size) {
    throw new BundleError(`references ${url.href} has ${bytes.byteLength} bytes, the manifest ` +
      `says ${references.size} (truncated or replaced)`);
  }
  const digest = await sha256(bytes);
  if (digest !== null && references.sha256 !== null && digest !== references.sha256) {
    throw new BundleError(`references ${url.href} has sha256 ${digest.slice(0, 16)}…, the ` +
      `manifest says ${String(references.sha256).slice(0, 16)}… (modified after export)`);
  }
}

// -- SigLIP 2 NaFlex: images of several aspect ratios, patches, a mask ----------------------
/**
 * A NaFlex reference image, regenerated (generator "mulberry32-rgb8-v1", Python's
 * runtime/naflex/references.py reference_image): mulberry32-uniform-v1's values for (H, W, 3) mapped
 * to bytes, floor((u + 2) · 64) -> { data: Uint8Array (H, W, 3), width, height, channels: 3 }.
 */
export function naflexImage(seed, [height, width]) {
  const u = seededInput(seed, [height, width, 3]);
  const data = new Uint8Array(u.length);
  for (let i = 0; i < u.length; i++) data[i] = Math.min(255, Math.max(0, Math.floor((u[i] + 2) * 64)));
  return { data, width, height, channels: 3 };
}

/**
 * The manifest's `naflex_references` (absent: null), checked as Python's
 * parse_naflex_references: the file listed under files with role "references", generator
 * "mulberry32-rgb8-v1", cases of 1 to 64 images {seed, size: [H, W]} whose outputs (of
 * `declared`, the graph's, in that order) lie inside the file, batch first.
 */
export function naflexReferences(m, declared, where = 'manifest') {
  const r = m?.naflex_references;
  if (r === undefined || r === null) return null;
  const at = `${where}: naflex_references`;
  const need = (ok, field, expected, got) => {
    if (!ok) throw new BundleError(`${at}${field} must be ${expected}, got ${show(got)}`);
  };
  need(typeof r === 'object' && !Array.isArray(r), '', 'an object', r);
  const entry = typeof r.file === 'string' && m.files !== null && typeof m.files === 'object' &&
    Object.hasOwn(m.files, r.file) ? m.files[r.file] : null;
  need(entry?.role === REFERENCES_ROLE && isInt(entry?.size), '.file',
    `a file listed under files with role ${show(REFERENCES_ROLE)}`, r.file);
  need(r.generator === NAFLEX_GENERATOR, '.generator', show(NAFLEX_GENERATOR), r.generator);
  need(typeof r.source === 'string', '.source', 'a string', r.source);
  need(Array.isArray(r.cases) && r.cases.length <= NAFLEX_MAX_CASES, '.cases',
    `a list of up to ${NAFLEX_MAX_CASES}`, r.cases);
  const { size } = entry;
  const cases = r.cases.map((c, k) => {
    const here = `.cases[${k}]`;
    const images = c?.images;
    need(c !== null && typeof c === 'object' && typeof c.name === 'string' && Array.isArray(images) &&
      images.length >= 1 && images.length <= NAFLEX_MAX_IMAGES && images.every((im) =>
      isInt(im?.seed) && im.seed <= 0xffffffff && Array.isArray(im.size) && im.size.length === 2 &&
        im.size.every((v) => isInt(v, 1) && v <= MAX_SIDE)) &&
      images.reduce((n, im) => n + im.size[0] * im.size[1] * 3, 0) <= NAFLEX_MAX_VALUES &&
      c.outputs !== null && typeof c.outputs === 'object' && Object.keys(c.outputs).length > 0, here,
    `{name, images: 1..${NAFLEX_MAX_IMAGES} of {seed, size: [H, W]} (${NAFLEX_MAX_VALUES} ` +
      'pixel values at most), outputs}', c);
    for (const name of Object.keys(c.outputs)) {
      need(declared.includes(name), `${here}.outputs`, `outputs the graph has (${show(declared)})`, name);
    }
    const outputs = {};
    for (const name of declared.filter((n) => Object.hasOwn(c.outputs, n))) {
      const o = c.outputs[name];
      const n = Array.isArray(o?.shape) && o.shape.length > 0 && o.shape.every((v) => isInt(v, 1))
        ? o.shape.reduce((a, b) => a * b, 1) : NaN;
      need(n > 0 && o.shape[0] === images.length && isInt(o.offset) && o.offset % 4 === 0 &&
        o.offset + 4 * n <= size, `${here}.outputs[${show(name)}]`, `{offset (bytes, a ` +
        `multiple of 4), shape [${images.length}, ...]} inside the ${size}-byte ${r.file}`, o);
      outputs[name] = { offset: o.offset, shape: [...o.shape] };
    }
    return { name: c.name, images: images.map((im) => ({ seed: im.seed, size: [...im.size] })), outputs };
  });
  return { file: r.file, generator: r.generator, source: r.source, size,
    sha256: entry.sha256 ?? null, cases };
}

/**
 * The check report of a loaded NaFlex model (`naflex`: its `precision`, `info.provider` and
 * `run(batch)`) against `references` (naflexReferences) and their bytes, as Python's
 * check/naflex.py's judge_case: each case's images regenerated, made into one batch by `pre`
 * (the bundle's NaFlexPreprocess), every stored output compared, the output `masked`
 * (last_hidden_state) at the real patches only (its padding rows zeroed, as stored); each
 * image's cosine (the least is reported). A case's resolution is its first image's resized
 * [H, W], as Python's; `latencyRuns` timed runs of the first case's graph.
 */
export async function naflexCheckReport(naflex, pre, references, bytes, { latencyRuns = 0, device,
  bundle, masked }) {
  checkRuns(latencyRuns);
  const { precision, info: { provider } } = naflex;
  const cases = [];
  const runs = [];
  for (const c of references.cases) {
    const batch = pre.batch(c.images.map((im) => naflexImage(im.seed, im.size)));
    const outputs = await naflex.run(batch);
    const { data: mask, dims: [B, N] } = batch.pixelAttentionMask;
    const sizes = c.images.slice(0, 6).map((im) => im.size.join('x')).join(',');
    const [gh, gw] = pre.grid(c.images[0].size[1], c.images[0].size[0]);
    const entry = { label: c.name, case: `naflex ${c.name} (${sizes}${c.images.length > 6 ? ', ...' : ''})`,
      provider, precision, resolution: [gh * pre.patchSize, gw * pre.patchSize], batch: B };
    runs.push({ batch, entry });
    for (const [name, where] of Object.entries(c.outputs)) {
      const out = outputs[name];
      if (out === undefined || out.dims.join() !== where.shape.join()) {
        throw new BundleError(`reference case ${show(c.name)}: output ${show(name)} has shape ` +
          `${show(where.shape)}, the model gave ${show(out?.dims ?? null)} (another patch budget?)`);
      }
      if (name === masked) { // padding rows are no output: zero, as the references store them
        const D = out.data.length / (B * N);
        for (let i = 0; i < B * N; i++) if (!mask[i]) out.data.fill(0, i * D, (i + 1) * D);
      }
      cases.push({ ...entry, output: name, ...compare(out.data, stored(bytes, where), precision, { rows: B }) });
    }
  }
  const latency = [];
  if (latencyRuns > 0 && runs.length) {
    const [{ batch, entry: { label: _, case: __, ...entry } }] = runs;
    latency.push(await latencyOf(() => naflex.run(batch), latencyRuns, entry));
  }
  return reportOf({ bundle, device, references, cases, latency });
}

/**
 * One report of several runs of one bundle on one device (the page's backends, wasm and
 * webgpu): their cases and latencies side by side, passed when every one passed. The device
 * is the first report's, with the GPU of whichever report ran on one.
 */
export function mergeReports(reports) {
  if (!reports.length) throw new Error('mergeReports takes at least one report, got none');
  const [first] = reports;
  const gpu = reports.map((r) => r.device.gpu).find((g) => g) ?? null;
  return { ...first, device: { ...first.device, gpu },
    passed: reports.every((r) => r.passed),
    cases: reports.flatMap((r) => r.cases), latency: reports.flatMap((r) => r.latency) };
}
