// The proof that travels with a bundle, in JavaScript: golden references (PyTorch fp32
// outputs of seeded inputs, references.bin) against what this runtime computes, judged by the
// project's tolerance policy (vit_deploy/runtime/contract.py, tied by
// tests/test_web_constants.py), into the report every runtime writes (schema
// "vit-deploy-report" v1: Python's `check --json`, Node's and the page's `vit.check()`).
import { show } from './common.mjs';

// The tolerance policy, PyTorch fp32 as the reference: fp32 max |Δ| <= FP32_ABS_TOL ·
// max(1, max |ref|) and cosine >= COSINE_MIN.fp32; other precisions by cosine only.
export const FP32_ABS_TOL = 1e-4;
export const COSINE_MIN = Object.freeze({ fp32: 0.99999, fp16: 0.999, int8: 0.99, int4: 0.95 });

export const REPORT_SCHEMA = 'vit-deploy-report';
export const REPORT_SCHEMA_VERSION = 1;
export const GENERATOR = 'mulberry32-uniform-v1';

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
 * (float64 sums; NaN or Inf anywhere fails, written as null).
 */
export function compare(got, ref, precision) {
  if (got.length !== ref.length) {
    throw new Error(`output has ${got.length} values, its reference ${ref.length}`);
  }
  const policy = toleranceClass(precision);
  let maxAbs = 0; let refMax = 0; let ab = 0; let aa = 0; let bb = 0;
  for (let i = 0; i < got.length; i++) {
    const a = got[i]; const b = ref[i];
    const d = Math.abs(a - b);
    maxAbs = d > maxAbs || Number.isNaN(d) ? d : maxAbs;
    refMax = Math.max(refMax, Math.abs(b));
    ab += a * b; aa += a * a; bb += b * b;
  }
  // identical vectors (zeros included) agree; a zero vector against a non-zero one does not
  const cosine = aa === 0 && bb === 0 ? 1 : ab / Math.sqrt(aa * bb);
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

/**
 * The check report of a loaded ViT (`vit`) against `references` (the manifest's, read) and
 * their bytes: every case × declared output; `latencyRuns` timed runs of the first case.
 */
export async function checkReport(vit, references, bytes, { latencyRuns = 0, device, bundle }) {
  if (!Number.isInteger(latencyRuns) || latencyRuns < 0) {
    throw new Error(`latencyRuns must be a non-negative integer, got ${show(latencyRuns)}`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const { precision, info } = vit;
  const cases = [];
  for (const c of references.cases) {
    const x = caseInput(c, bytes);
    const names = Object.keys(c.outputs);
    const outputs = await vit.runAll(x, c.shape, names);
    for (const name of names) {
      const { offset, shape } = c.outputs[name];
      const ref = new Float32Array(shape.reduce((a, b) => a * b, 1));
      for (let i = 0; i < ref.length; i++) ref[i] = view.getFloat32(offset + 4 * i, true);
      cases.push({ label: c.name, provider: info.provider, precision,
        resolution: [c.shape[2], c.shape[3]], batch: c.shape[0], output: name,
        ...compare(outputs[name].data, ref, precision) });
    }
  }
  const latency = [];
  if (latencyRuns > 0 && references.cases.length) {
    const [first] = references.cases;
    const x = caseInput(first, bytes);
    const name = Object.keys(first.outputs)[0];
    await vit.runAll(x, first.shape, [name]); // warm-up: the first run at a size plans it
    const times = [];
    for (let i = 0; i < latencyRuns; i++) {
      const t = performance.now();
      await vit.runAll(x, first.shape, [name]);
      times.push(performance.now() - t);
    }
    latency.push({ provider: info.provider, precision, resolution: [first.shape[2], first.shape[3]],
      batch: first.shape[0], ...percentiles(times), runs: latencyRuns });
  }
  return {
    schema: REPORT_SCHEMA, schema_version: REPORT_SCHEMA_VERSION, kind: 'check', bundle, device,
    reference: referenceName(references.source),
    passed: cases.length > 0 && cases.every((c) => c.passed), cases, latency,
  };
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
