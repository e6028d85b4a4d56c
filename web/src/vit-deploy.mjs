// vit-deploy's JavaScript runtime: a bundle (manifest.json + ONNX model) in the browser
// (onnxruntime-web: WebGPU when the browser offers an adapter, else WebAssembly) or in Node
// (onnxruntime-node), with the manifest's preprocessing reproduced from
// vit_deploy/runtime/preprocess.py: the same tensor as Python, bit for bit, from the same
// RGB pixels (the resize is Pillow's, written out below; a canvas `drawImage` filter is
// unspecified, so the canvas is only used to decode).
//
//   import { ViT } from './vit-deploy.mjs';
//   const vit = await ViT.load('bundle/', { precision: 'fp32', threads: 2 });
//   const { top } = await vit.classify(fileOrBlobOrUrl);   // [{ index, label, probability }]
//   const logits = await vit.run(pixels, [1, 3, 224, 224]); // raw logits, Float32Array
//   const { data, dims } = await vit.features(image);       // [1, D, gh, gw] patch tokens
//   vit.info  // { backend, provider, threads, threadsRequested, fallback, ... }

export const BUNDLE_FORMAT = 'vit-deploy-bundle';
export const BUNDLE_FORMAT_VERSION = 2; // the newest manifest format this module reads
export const RESIZE_RULES = ['shorter_side_center_crop', 'patch_multiple'];
export const INTERPOLATIONS = ['bicubic', 'bilinear', 'nearest', 'lanczos'];
export const MAX_PIXELS = 89_478_485; // Pillow's decompression-bomb bound, as in Python
export const MAX_SIDE = 16384; // the longest side a resize rule may give the model input
export const WEB_RECORD = 'web.json'; // what `vit-deploy web` adds beside the manifest
export const LOGITS = 'logits';
export const PATCH_TOKENS = 'patch_tokens';
// Bounds on what preprocessing computes with, (pixel * scale - mean) / std: those of
// vit_deploy/runtime/config.py's check_normalization (any 8-bit pixel gives a finite float32).
export const MAX_ABS_MEAN = 1e4;
export const MIN_STD = 1e-6;
export const MAX_STD = 1e4;
export const MIN_SCALE = 1e-6;
export const MAX_SCALE = 1e3;

/** Outputs laid out on the patch grid, [batch, width, gh, gw]: patch_tokens and layer_N
 * (vit_deploy/outputs.py's is_grid_output). */
export const isGridOutput = (name) => name === PATCH_TOKENS || /^layer_[0-9]+$/.test(name);

const IS_NODE = typeof process !== 'undefined' && !!process.versions?.node &&
  typeof window === 'undefined';

/** A bundle that cannot be used: says which file and why. */
export class BundleError extends Error {
  constructor(message) { super(message); this.name = 'BundleError'; }
}

/** An input that is not a usable image: says which one and why. */
export class ImageError extends Error {
  constructor(message) { super(message); this.name = 'ImageError'; }
}

// -- the manifest ---------------------------------------------------------------------
const show = (v) => { const s = JSON.stringify(v); return s === undefined ? String(v) : s.slice(0, 60); };

function need(ok, where, field, expected, got) {
  if (!ok) throw new BundleError(`${where}: ${field} must be ${expected}, got ${show(got)}`);
}

const isInt = (v, low = 0) => Number.isInteger(v) && v >= low;
const isReal = (v) => typeof v === 'number' && Number.isFinite(v);

/**
 * An Error (what + field, expected, given) unless mean and std are `channels` (default: as
 * many as each other) finite numbers within the bounds above, and `scale` (if given) too.
 * The one check for the manifest and for Preprocess (options a caller passes included).
 */
export function checkNormalization(mean, std, { channels = null, scale, what = '' } = {}) {
  if (channels === null && Array.isArray(mean) && Array.isArray(std) && mean.length !== std.length) {
    throw new Error(`${what}mean and ${what}std must have as many values (one per channel), ` +
      `got ${mean.length} and ${std.length}`);
  }
  let n = channels;
  for (const [name, values, low, high] of [['mean', mean, -MAX_ABS_MEAN, MAX_ABS_MEAN],
    ['std', std, MIN_STD, MAX_STD]]) {
    if (!(Array.isArray(values) && values.length > 0 && (n === null || values.length === n) &&
      values.every((v) => isReal(v) && v >= low && v <= high))) {
      throw new Error(`${what}${name} must be ${n === null ? '' : `${n} `}finite numbers from ` +
        `${low} to ${high}, got ${show(values)}`);
    }
    n = values.length;
  }
  if (scale !== undefined && !(isReal(scale) && scale >= MIN_SCALE && scale <= MAX_SCALE)) {
    throw new Error(`${what}scale must be a finite number from ${MIN_SCALE} to ${MAX_SCALE}, ` +
      `got ${show(scale)}`);
  }
}

/** A file name a bundle gives (manifest, web.json): a relative path inside it, as Python's
 * bundle_path; no absolute path or URL, no '..', no backslash, NUL, '?' or '#'. */
function safeName(name) {
  return typeof name === 'string' && name.length > 0 && name.length <= 4096 &&
    !/[\\\0?#]/.test(name) && !name.startsWith('/') && !/^[a-z][a-z0-9+.-]*:/i.test(name) &&
    !name.split('/').some((part) => part === '..' || /^(\.|%2e){2}$/i.test(part));
}

/**
 * The one way from a file name the bundle gives to a URL: refused (BundleError) unless it is
 * a relative path that stays under `base` (same origin, same directory). In Node, for
 * file: URLs, the real path (symlinks resolved) must stay inside the bundle's real path too.
 */
export async function bundleFile(base, name, what = 'file') {
  if (!safeName(name)) {
    throw new BundleError(`${what} ${show(name)}: expected a relative path inside the bundle ` +
      `(no absolute path or URL, no '..')`);
  }
  const url = new URL(name, base);
  if (url.origin !== base.origin || !url.href.startsWith(base.href)) {
    throw new BundleError(`${what} ${show(name)} resolves to ${url.href}, outside the bundle ${base.href}; refused`);
  }
  if (IS_NODE && url.protocol === 'file:') {
    const { realpath } = await import('node:fs/promises');
    const { fileURLToPath } = await import('node:url');
    const path = await import('node:path');
    let root;
    let real;
    try {
      root = await realpath(fileURLToPath(base));
      real = await realpath(fileURLToPath(url));
    } catch (e) {
      throw new BundleError(`${what} ${show(name)} could not be read from the bundle (${e.code ?? e.message})`);
    }
    if (!real.startsWith(root + path.sep)) {
      throw new BundleError(`${what} ${show(name)} resolves to ${real}, outside the bundle ${root} ` +
        `(a symlink leaving it?); refused`);
    }
  }
  return url;
}

/**
 * The parts of a manifest (format v1 or v2, as runtime/manifest.py writes it) this runtime
 * reads, checked: preprocessing, input and output names, models, labels.
 */
export function readManifest(m, where = 'manifest') {
  need(m !== null && typeof m === 'object' && !Array.isArray(m), where, 'the manifest',
    'a JSON object', m);
  need(m.format === BUNDLE_FORMAT && isInt(m.format_version, 1) &&
    m.format_version <= BUNDLE_FORMAT_VERSION, where, 'format',
    `${show(BUNDLE_FORMAT)} up to v${BUNDLE_FORMAT_VERSION}`, `${m.format} v${m.format_version}`);
  const io = m.io ?? {};
  const P = io.patch_size;
  need(isInt(P, 1), where, 'io.patch_size', 'a positive integer', P);
  need(Array.isArray(io.inputs) && io.inputs.length > 0 && typeof io.inputs[0]?.name === 'string',
    where, 'io.inputs', 'a non-empty list of {name, shape, dtype}', io.inputs);
  need(Array.isArray(io.outputs) && io.outputs.length > 0 &&
    io.outputs.every((o) => typeof o?.name === 'string'), where, 'io.outputs',
  'a non-empty list of {name, shape, dtype}', io.outputs);
  const pre = m.preprocess ?? {};
  const res = pre.resolution;
  need(Array.isArray(res) && res.length === 2 && res.every((v) => isInt(v, P) && v % P === 0 &&
    v <= MAX_SIDE), where, 'preprocess.resolution',
  `[height, width], multiples of the patch size ${P} up to ${MAX_SIDE}`, res);
  const resize = pre.resize ?? 'shorter_side_center_crop';
  const interpolation = pre.interpolation ?? 'bicubic';
  const scale = pre.scale === undefined ? 1 / 255 : pre.scale;
  try { // the bounds every source of these numbers meets (as Python's manifest)
    checkNormalization(pre.mean, pre.std, { channels: 3, scale, what: 'preprocess.' });
  } catch (e) {
    throw new BundleError(`${where}: ${e.message}`);
  }
  need(RESIZE_RULES.includes(resize), where, 'preprocess.resize', `one of ${show(RESIZE_RULES)}`,
    resize);
  need(INTERPOLATIONS.includes(interpolation), where, 'preprocess.interpolation',
    `one of ${show(INTERPOLATIONS)}`, interpolation);
  const models = m.models ?? {};
  need(typeof models === 'object' && typeof models.fp32 === 'string', where, 'models',
    'an object with an fp32 model', models);
  const files = m.files ?? {};
  for (const [precision, file] of Object.entries(models)) {
    need(safeName(file) && Object.hasOwn(files, file), where, `models[${show(precision)}]`,
      'a relative path inside the bundle listed under files', file);
  }
  // one label per class: the logits' last dimension (the classes of the config without it)
  const logits = io.outputs.find((o) => o.name === LOGITS);
  const classes = logits ? logits.shape?.at(-1) : (m.config?.num_classes || null);
  need(m.labels == null || (Array.isArray(m.labels) && m.labels.length === classes &&
    m.labels.every((x) => typeof x === 'string')), where, 'labels',
  `null or ${classes} strings (one per output of the model)`, m.labels);
  return {
    name: m.config?.name ?? 'ViT',
    patchSize: P,
    dynamic: io.dynamic !== false,
    input: io.inputs[0].name,
    outputs: io.outputs.map((o) => o.name),
    models: { ...models },
    int8Cpu: Object.fromEntries(Object.keys(models).map((p) => [p, int8Cpu(m, p)])),
    labels: m.labels ?? null,
    preprocess: {
      resolution: [res[0], res[1]], patchSize: P, mean: [...pre.mean], std: [...pre.std],
      resize, interpolation, scale,
    },
  };
}

// -- int8 and the CPU: runtime/cpu.py in JavaScript ---------------------------------------
// x86 flags whose kernels sum u8 x s8 products in 32 bits; x86 with AVX2 only saturates the
// 16-bit pair sums of 8-bit weights (a recipe with cpu 'vnni'), ARM64 does not
export const X86_INT8_EXACT = ['avx512_vnni', 'avx_vnni', 'amx_int8'];
export const INT8_CPUS = ['any', 'vnni'];

/** The CPUs a precision's int8 file is exact on ('any', 'vnni'), or null when it is not
 * int8: as Python's Manifest.int8_cpu. */
export function int8Cpu(m, precision) {
  const recipe = m.precisions?.[precision]?.recipe;
  if (!recipe || !['dynamic', 'static QDQ'].includes(recipe.kind)) return null;
  if (INT8_CPUS.includes(recipe.cpu)) return recipe.cpu;
  return recipe.cpu == null && recipe.reduce_range === true ? 'any' : 'vnni';
}

/** Whether an x86 CPU with these /proc/cpuinfo flags runs 8-bit int8 weights exactly. */
export function exactInt8(arch, flags) {
  if (arch === 'arm64') return true;
  if (arch !== 'x64' || flags == null) return null;
  return X86_INT8_EXACT.some((f) => flags.includes(f)) || !flags.includes('avx2');
}

async function cpuFlags() {
  if (!IS_NODE || process.platform !== 'linux') return null;
  try {
    const { readFile } = await import('node:fs/promises');
    const text = await readFile('/proc/cpuinfo', 'utf8');
    const line = text.split('\n').find((l) => /^(flags|Features)\s*:/.test(l));
    return line ? line.split(':')[1].trim().split(/\s+/) : null;
  } catch { return null; }
}

/** A warning for running an int8 file that needs `need` here (onnxruntime-node's CPU
 * kernels are Python's); null when exact or not int8. WebAssembly's kernels widen to 32
 * bits before they add. */
export async function int8Warning(need, { node = IS_NODE, arch = globalThis.process?.arch,
  flags } = {}) {
  if (need !== 'vnni' || !node) return null;
  const ok = exactInt8(arch, flags === undefined ? await cpuFlags() : flags);
  if (ok) return null;
  return ok === false
    ? 'this int8 file has 8-bit weights, which this CPU (x86 with AVX2, no VNNI / AMX) ' +
      'saturates: expect wrong outputs (re-quantise with --int8-cpu any)'
    : 'this int8 file has 8-bit weights, exact on x86 with VNNI / AMX or ARM64; cannot tell ' +
      'whether this CPU has them';
}

// -- preprocessing: runtime/preprocess.py in JavaScript --------------------------------
/** Python's round(): halves to even (Math.round takes them up). For x >= 0. */
export function pyRound(x) {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/**
 * How pixels become model input, read from the manifest (fields as Python's `Preprocess`:
 * resolution [H, W], patchSize, mean, std, resize, interpolation, scale).
 */
export class Preprocess {
  constructor({ resolution, patchSize, mean, std, resize = 'shorter_side_center_crop',
    interpolation = 'bicubic', scale = 1 / 255 }) {
    if (!RESIZE_RULES.includes(resize)) {
      throw new Error(`resize rule must be one of ${show(RESIZE_RULES)}, got ${show(resize)}`);
    }
    if (!INTERPOLATIONS.includes(interpolation)) {
      throw new Error(`interpolation must be one of ${show(INTERPOLATIONS)}, got ` +
        `${show(interpolation)}`);
    }
    const r = typeof resolution === 'number' ? [resolution, resolution] : resolution;
    if (!Array.isArray(r) || r.length !== 2 || !r.every((v) => isInt(v, 1) && v <= MAX_SIDE)) {
      throw new Error(`resolution must be N or [height, width] of integers from 1 to ${MAX_SIDE}, got ` +
        `${show(resolution)}`);
    }
    if (!(isInt(patchSize, 1) && patchSize <= MAX_SIDE)) {
      throw new Error(`patchSize must be an integer from 1 to ${MAX_SIDE}, got ${show(patchSize)}`);
    }
    checkNormalization(mean, std, { scale });
    if (mean.length !== 3) throw new Error(`mean and std must hold 3 values (RGB), got ${mean.length}`);
    Object.assign(this, { resolution: [r[0], r[1]], patchSize, mean: [...mean], std: [...std],
      resize, interpolation, scale });
    Object.freeze(this);
  }

  /** The manifest's preprocessing; `overrides` replaces fields (undefined ones are ignored). */
  static fromManifest(manifest, overrides = {}) {
    const given = Object.fromEntries(Object.entries(overrides).filter(([, v]) => v != null));
    return new Preprocess({ ...manifest.preprocess, ...given });
  }

  /** [H, W] the image will have after resizing (and cropping). */
  targetSize(width, height) {
    if (this.resize === 'shorter_side_center_crop') return [...this.resolution];
    const P = this.patchSize;
    const scale = Math.min(...this.resolution) / Math.min(width, height);
    return [Math.max(P, pyRound(height * scale / P) * P), Math.max(P, pyRound(width * scale / P) * P)];
  }

  /** { target: [H, W], resized: [H, W] } or an ImageError when a rule would blow it up. */
  plan(width, height) {
    if (!(width >= 1 && height >= 1)) {
      throw new ImageError(`image is ${width}x${height}: expected at least 1x1 pixels`);
    }
    const [th, tw] = this.targetSize(width, height);
    const rule = `the '${this.resize}' rule`;
    if (Math.max(th, tw) > MAX_SIDE) {
      throw new ImageError(`a ${width}x${height} image becomes a ${tw}x${th} input under ${rule}; ` +
        `expected sides of at most ${MAX_SIDE}`);
    }
    let [rh, rw] = [th, tw];
    if (this.resize === 'shorter_side_center_crop') {
      const s = Math.max(th / height, tw / width);
      [rh, rw] = [Math.max(th, pyRound(height * s)), Math.max(tw, pyRound(width * s))];
    }
    if (rw * rh > MAX_PIXELS) {
      throw new ImageError(`a ${width}x${height} image is resized to ${rw}x${rh} = ${rw * rh} ` +
        `pixels under ${rule}, over the limit of ${MAX_PIXELS}`);
    }
    return { target: [th, tw], resized: [rh, rw] };
  }

  /**
   * Decoded pixels { data, width, height, channels? } (RGBA, as ImageData, or RGB) ->
   * { data: Float32Array (3, H, W), dims: [1, 3, H, W] }. Alpha is composited on white.
   */
  tensor(image) {
    const rgb = toRGB(image);
    const { width, height } = rgb;
    const { target: [th, tw], resized: [rh, rw] } = this.plan(width, height);
    let pixels = resize(rgb.data, width, height, rw, rh, this.interpolation);
    if (rh !== th || rw !== tw) { // shorter side resized to cover the target: centre crop
      pixels = crop(pixels, rw, Math.floor((rw - tw) / 2), Math.floor((rh - th) / 2), tw, th);
    }
    // numpy float32 arithmetic, bit for bit: x * f32(scale), then (x - f32(mean)) / f32(std)
    const f = Math.fround;
    const scale = f(this.scale);
    const out = new Float32Array(3 * th * tw);
    const plane = th * tw;
    for (let c = 0; c < 3; c++) {
      const mean = f(this.mean[c]);
      const std = f(this.std[c]);
      for (let i = 0; i < plane; i++) out[c * plane + i] = f(f(pixels[i * 3 + c] * scale) - mean) / std;
    }
    return { data: out, dims: [1, 3, th, tw] };
  }
}

/** RGBA or RGB pixels -> { data: RGB Uint8Array, width, height }, alpha on white (Pillow). */
export function toRGB({ data, width, height, channels }) {
  const n = width * height;
  const ch = channels ?? (data.length === n * 3 ? 3 : 4);
  if (!(isInt(width, 1) && isInt(height, 1)) || (ch !== 3 && ch !== 4) || data.length !== n * ch) {
    throw new ImageError(`expected pixels { data, width, height } with 3 or 4 bytes a pixel, ` +
      `got ${data?.length} bytes for ${width}x${height}`);
  }
  if (ch === 3) return { data: Uint8Array.from(data), width, height };
  const out = new Uint8Array(n * 3);
  for (let i = 0; i < n; i++) {
    const a = data[i * 4 + 3];
    for (let c = 0; c < 3; c++) {
      const v = data[i * 4 + c];
      if (a === 255) { out[i * 3 + c] = v; continue; }
      // Pillow's alpha_composite over opaque white (AlphaComposite.c, PRECISION_BITS 7)
      const coef1 = a * 128;
      const coef2 = 255 * 128 - coef1;
      const t = v * coef1 + 255 * coef2 + (0x80 << 7);
      out[i * 3 + c] = (((t >> 8) + t) >> 8) >> 7;
    }
  }
  return { data: out, width, height };
}

function crop(pixels, width, left, top, w, h) {
  const out = new Uint8Array(w * h * 3);
  for (let y = 0; y < h; y++) {
    const from = ((top + y) * width + left) * 3;
    out.set(pixels.subarray(from, from + w * 3), y * w * 3);
  }
  return out;
}

// Pillow's resize (libImaging/Resample.c): separable convolution, support scaled by the
// downscale factor, weights in 22-bit fixed point, 8-bit rounding between the passes.
const PRECISION_BITS = 32 - 8 - 2;
const sinc = (x) => { if (x === 0) return 1; const y = x * Math.PI; return Math.sin(y) / y; };
const FILTERS = {
  bilinear: { support: 1, f: (x) => { x = Math.abs(x); return x < 1 ? 1 - x : 0; } },
  bicubic: {
    support: 2,
    f: (x) => {
      const a = -0.5;
      x = Math.abs(x);
      if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
      if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
      return 0;
    },
  },
  lanczos: { support: 3, f: (x) => (x >= -3 && x < 3 ? sinc(x) * sinc(x / 3) : 0) },
};

function coefficients(inSize, outSize, filter) {
  const scale = inSize / outSize;
  const filterscale = Math.max(scale, 1);
  const support = filter.support * filterscale;
  const ksize = Math.ceil(support) * 2 + 1;
  const bounds = new Int32Array(outSize * 2);
  const kk = new Int32Array(outSize * ksize);
  const k = new Float64Array(ksize);
  for (let xx = 0; xx < outSize; xx++) {
    const center = (xx + 0.5) * scale;
    const ss = 1 / filterscale;
    const xmin = Math.max(0, Math.trunc(center - support + 0.5));
    const xmax = Math.min(inSize, Math.trunc(center + support + 0.5)) - xmin;
    let ww = 0;
    for (let x = 0; x < xmax; x++) { k[x] = filter.f((x + xmin - center + 0.5) * ss); ww += k[x]; }
    for (let x = 0; x < xmax; x++) {
      const w = ww !== 0 ? k[x] / ww : k[x];
      kk[xx * ksize + x] = Math.trunc(w < 0 ? -0.5 + w * (1 << PRECISION_BITS)
        : 0.5 + w * (1 << PRECISION_BITS));
    }
    bounds[xx * 2] = xmin;
    bounds[xx * 2 + 1] = xmax;
  }
  return { ksize, bounds, kk };
}

const clip8 = (v) => { const s = Math.floor(v / (1 << PRECISION_BITS)); return s < 0 ? 0 : s > 255 ? 255 : s; };

/** RGB bytes, inW x inH -> outW x outH, as Pillow's Image.resize with this filter. */
export function resize(pixels, inW, inH, outW, outH, interpolation = 'bicubic') {
  if (outW === inW && outH === inH) return Uint8Array.from(pixels);
  if (interpolation === 'nearest') return resizeNearest(pixels, inW, inH, outW, outH);
  const filter = FILTERS[interpolation];
  if (!filter) throw new Error(`interpolation must be one of ${show(INTERPOLATIONS)}, got ${show(interpolation)}`);
  const horiz = coefficients(inW, outW, filter);
  const vert = coefficients(inH, outH, filter);
  let src = pixels;
  let width = inW;
  let rowOffset = 0; // rows of `src` start at this source row
  const half = 1 << (PRECISION_BITS - 1);
  if (outW !== inW) { // horizontal pass over the rows the vertical pass reads
    const first = vert.bounds[0];
    const last = vert.bounds[outH * 2 - 2] + vert.bounds[outH * 2 - 1];
    const rows = outH !== inH ? last - first : inH;
    rowOffset = outH !== inH ? first : 0;
    const tmp = new Uint8Array(outW * rows * 3);
    const { ksize, bounds, kk } = horiz;
    for (let y = 0; y < rows; y++) {
      const row = (y + rowOffset) * inW * 3;
      for (let xx = 0; xx < outW; xx++) {
        const xmin = bounds[xx * 2];
        const xmax = bounds[xx * 2 + 1];
        let s0 = half; let s1 = half; let s2 = half;
        for (let x = 0; x < xmax; x++) {
          const w = kk[xx * ksize + x];
          const p = row + (x + xmin) * 3;
          s0 += src[p] * w; s1 += src[p + 1] * w; s2 += src[p + 2] * w;
        }
        const o = (y * outW + xx) * 3;
        tmp[o] = clip8(s0); tmp[o + 1] = clip8(s1); tmp[o + 2] = clip8(s2);
      }
    }
    src = tmp;
    width = outW;
  }
  if (outH === inH) return src;
  const out = new Uint8Array(width * outH * 3);
  const { ksize, bounds, kk } = vert;
  for (let yy = 0; yy < outH; yy++) {
    const ymin = bounds[yy * 2] - rowOffset;
    const ymax = bounds[yy * 2 + 1];
    for (let xx = 0; xx < width; xx++) {
      let s0 = half; let s1 = half; let s2 = half;
      for (let y = 0; y < ymax; y++) {
        const w = kk[yy * ksize + y];
        const p = ((y + ymin) * width + xx) * 3;
        s0 += src[p] * w; s1 += src[p + 1] * w; s2 += src[p + 2] * w;
      }
      const o = (yy * width + xx) * 3;
      out[o] = clip8(s0); out[o + 1] = clip8(s1); out[o + 2] = clip8(s2);
    }
  }
  return out;
}

// Pillow resizes with NEAREST by an affine scale (Geometry.c, ImagingScaleAffine): source
// positions accumulated step by step from half a step in, truncated.
function resizeNearest(pixels, inW, inH, outW, outH) {
  const COORD = (v) => (v < 0 ? -1 : Math.trunc(v));
  const ax = inW / outW;
  const ay = inH / outH;
  const xs = new Int32Array(outW).fill(-1);
  let xo = ax * 0.5;
  for (let x = 0; x < outW; x++) {
    const xi = COORD(xo);
    if (xi >= 0 && xi < inW) xs[x] = xi;
    xo += ax;
  }
  const out = new Uint8Array(outW * outH * 3);
  let yo = ay * 0.5;
  for (let y = 0; y < outH; y++) {
    const yi = COORD(yo);
    if (yi >= 0 && yi < inH) {
      for (let x = 0; x < outW; x++) {
        if (xs[x] < 0) continue;
        const p = (yi * inW + xs[x]) * 3;
        const o = (y * outW + x) * 3;
        out[o] = pixels[p]; out[o + 1] = pixels[p + 1]; out[o + 2] = pixels[p + 2];
      }
    }
    yo += ay;
  }
  return out;
}

// -- decoding --------------------------------------------------------------------------
function checkPixels(width, height, what) {
  if (width < 1 || height < 1) throw new ImageError(`${what} is ${width}x${height}: expected at least 1x1 pixels`);
  if (width * height > MAX_PIXELS) {
    throw new ImageError(`${what} is ${width}x${height} = ${width * height} pixels, over the ` +
      `limit of ${MAX_PIXELS} (decompression-bomb guard)`);
  }
}

const isPixels = (x) => x && typeof x === 'object' && 'data' in x && 'width' in x && 'height' in x &&
  ArrayBuffer.isView(x.data);

/**
 * Any image this environment can decode -> { data: RGBA or RGB bytes, width, height }.
 * Browser: a File / Blob, URL, ArrayBuffer, <img>, ImageBitmap, canvas or ImageData (decoded
 * by the browser at its own size, EXIF orientation applied, no colour conversion, never
 * resized by the canvas). Node: PNG or JPEG bytes or a path (pngjs, jpeg-js). Both: decoded
 * pixels { data, width, height }.
 */
export async function decodeImage(src) {
  if (isPixels(src)) return src;
  return IS_NODE ? decodeNode(src) : decodeBrowser(src);
}

async function decodeBrowser(src) {
  let source = src;
  const what = typeof src === 'string' || src instanceof URL ? `image ${String(src)}` : 'image';
  try {
    if (typeof src === 'string' || src instanceof URL) {
      const response = await fetch(src);
      if (!response.ok) throw new ImageError(`${what}: HTTP ${response.status}`);
      source = await response.blob();
    } else if (src instanceof ArrayBuffer || ArrayBuffer.isView(src)) {
      source = new Blob([src]);
    }
    if (typeof HTMLImageElement !== 'undefined' && source instanceof HTMLImageElement) await source.decode();
    const bitmap = await createImageBitmap(source, { imageOrientation: 'from-image',
      premultiplyAlpha: 'none', colorSpaceConversion: 'none' });
    const { width, height } = bitmap;
    checkPixels(width, height, what);
    const canvas = typeof OffscreenCanvas !== 'undefined' ? new OffscreenCanvas(width, height)
      : Object.assign(document.createElement('canvas'), { width, height });
    const ctx = canvas.getContext('2d', { willReadFrequently: true, colorSpace: 'srgb' });
    ctx.drawImage(bitmap, 0, 0); // same size: a copy, no resampling
    bitmap.close?.();
    const { data } = ctx.getImageData(0, 0, width, height);
    return { data, width, height, channels: 4 };
  } catch (e) {
    if (e instanceof ImageError) throw e;
    throw new ImageError(`${what} could not be decoded (${e?.name}: ${e?.message})`);
  }
}

async function decodeNode(src) {
  let bytes = src;
  let what = 'image bytes';
  if (typeof src === 'string' || src instanceof URL) {
    const { readFile } = await import('node:fs/promises');
    what = `image ${JSON.stringify(String(src))}`;
    try {
      bytes = await readFile(src);
    } catch (e) {
      throw new ImageError(`${what} could not be read (${e.code ?? e.name}: ${e.message})`);
    }
  } else if (src instanceof ArrayBuffer) {
    bytes = new Uint8Array(src);
  }
  if (!ArrayBuffer.isView(bytes)) {
    throw new ImageError('expected PNG or JPEG bytes, a path, or pixels { data, width, height }, ' +
      `got ${src?.constructor?.name ?? typeof src}`);
  }
  bytes = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length === 0) throw new ImageError(`${what} is empty (0 bytes)`);
  const png = bytes.length >= 24 && bytes.readUInt32BE(0) === 0x89504e47;
  const jpeg = bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8;
  if (!png && !jpeg) throw new ImageError(`${what} is not a PNG or JPEG (in Node this module decodes those two)`);
  try {
    if (png) {
      checkPixels(bytes.readUInt32BE(16), bytes.readUInt32BE(20), what); // IHDR, before decoding
      const { PNG } = (await import('pngjs')).default;
      const { data, width, height } = PNG.sync.read(bytes);
      return { data, width, height, channels: 4 };
    }
    const jpegjs = (await import('jpeg-js')).default;
    const image = jpegjs.decode(bytes, { useTArray: true, formatAsRGBA: true,
      maxResolutionInMP: MAX_PIXELS / 1e6, maxMemoryUsageInMB: 2048 });
    checkPixels(image.width, image.height, what);
    return orient({ ...image, channels: 4 }, exifOrientation(bytes));
  } catch (e) {
    if (e instanceof ImageError) throw e;
    throw new ImageError(`${what} could not be decoded (${e?.name}: ${e?.message})`);
  }
}

/** The EXIF Orientation tag (1..8) of JPEG bytes; 1 when there is none. */
export function exifOrientation(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let p = 2;
  while (p + 4 <= view.byteLength && view.getUint8(p) === 0xff) {
    const marker = view.getUint8(p + 1);
    const length = view.getUint16(p + 2);
    if (marker === 0xda) break; // start of scan: no more metadata
    if (marker === 0xe1 && length >= 16 && view.getUint32(p + 4) === 0x45786966) { // "Exif"
      const tiff = p + 10;
      const little = view.getUint16(tiff) === 0x4949;
      const u16 = (o) => view.getUint16(o, little);
      const u32 = (o) => view.getUint32(o, little);
      const end = Math.min(view.byteLength, p + 2 + length);
      const ifd = tiff + u32(tiff + 4);
      if (ifd + 2 > end) return 1;
      const count = u16(ifd);
      for (let i = 0; i < count && ifd + 2 + i * 12 + 12 <= end; i++) {
        const entry = ifd + 2 + i * 12;
        if (u16(entry) === 0x0112) {
          const v = u16(entry + 8);
          return v >= 1 && v <= 8 ? v : 1;
        }
      }
      return 1;
    }
    p += 2 + length;
  }
  return 1;
}

/** Pixels turned upright by an EXIF orientation, as Pillow's ImageOps.exif_transpose. */
export function orient(image, orientation) {
  if (orientation === 1) return image;
  const { data, width: w, height: h } = image;
  const ch = image.channels ?? 4;
  const swap = orientation >= 5;
  const [W, H] = swap ? [h, w] : [w, h];
  const out = new Uint8Array(W * H * ch);
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      let sx; let sy; // the source pixel shown at (x, y)
      switch (orientation) {
        case 2: sx = w - 1 - x; sy = y; break;
        case 3: sx = w - 1 - x; sy = h - 1 - y; break;
        case 4: sx = x; sy = h - 1 - y; break;
        case 5: sx = y; sy = x; break;
        case 6: sx = y; sy = h - 1 - x; break;
        case 7: sx = w - 1 - y; sy = h - 1 - x; break;
        default: sx = w - 1 - y; sy = x; break; // 8
      }
      const s = (sy * w + sx) * ch;
      out.set(data.subarray(s, s + ch), (y * W + x) * ch);
    }
  }
  return { data: out, width: W, height: H, channels: ch };
}

// -- results ---------------------------------------------------------------------------
/** Softmax in float64, as the Python runtime's. */
export function softmax(logits) {
  let max = -Infinity;
  for (const v of logits) max = Math.max(max, v);
  const out = new Float64Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) { out[i] = Math.exp(logits[i] - max); sum += out[i]; }
  for (let i = 0; i < out.length; i++) out[i] /= sum;
  return out;
}

/** The k most probable classes, ties by index: [{ index, label, probability }]. */
export function topK(logits, k, labels = null) {
  const p = softmax(logits);
  const order = Array.from(p.keys()).sort((a, b) => p[b] - p[a] || a - b);
  return order.slice(0, Math.min(k, p.length)).map((index) => (
    { index, label: labels ? labels[index] : null, probability: p[index] }));
}

/** A model output that is no result (NaN or ±Inf): says which output and how many. */
export class OutputError extends Error {
  constructor(message) { super(message); this.name = 'OutputError'; }
}

/** `values`, or an OutputError when the model produced NaN or ±Inf there (as Python's). */
export function requireFinite(values, name) {
  let bad = 0;
  for (const v of values) if (!Number.isFinite(v)) bad++;
  if (bad) {
    throw new OutputError(`the model's output ${show(name)} holds ${bad} NaN/Inf value(s) of ` +
      `${values.length}: no usable result (a broken model, or preprocessing values that overflow it)`);
  }
  return values;
}

const labelsMismatch = (labels, width, output, where) => `the manifest has ${labels} labels, but ` +
  `the model's output ${show(output)} in ${where} has ${width} classes; expected one label per class`;

// -- loading and running ---------------------------------------------------------------
async function fetchBytes(url, what) {
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new BundleError(`${what} ${url} could not be fetched (${e.message})`);
  }
  if (!response.ok) throw new BundleError(`${what} ${url}: HTTP ${response.status} ${response.statusText}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function fetchJSON(url, what, { optional = false } = {}) {
  if (IS_NODE && url.protocol === 'file:') {
    const { readFile } = await import('node:fs/promises');
    let text;
    try {
      text = await readFile(url, 'utf8');
    } catch (e) {
      if (optional && e.code === 'ENOENT') return null;
      throw new BundleError(`${what} ${url.pathname} could not be read (${e.code ?? e.message})`);
    }
    return parseJSON(text, `${what} ${url.pathname}`);
  }
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new BundleError(`${what} ${url} could not be fetched (${e.message})`);
  }
  if (optional && response.status === 404) return null;
  if (!response.ok) throw new BundleError(`${what} ${url}: HTTP ${response.status} ${response.statusText}`);
  return parseJSON(await response.text(), `${what} ${url}`);
}

function parseJSON(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new BundleError(`${what} is not valid JSON: ${e.message}`);
  }
}

function bundleURL(source) {
  if (source instanceof URL) return source.href.endsWith('/') ? source : new URL(`${source.href}/`);
  const text = String(source);
  const withSlash = text.endsWith('/') ? text : `${text}/`;
  if (/^[a-z][a-z0-9+.-]*:/i.test(text) && !/^[a-z]:[\\/]/i.test(text)) return new URL(withSlash);
  if (IS_NODE) {
    // a path: resolved against the working directory
    const cwd = process.cwd().replaceAll('\\', '/');
    return new URL(withSlash, `file://${cwd.startsWith('/') ? '' : '/'}${cwd}/`);
  }
  return new URL(withSlash, globalThis.location?.href);
}

async function loadOrt(backend, ortBase) {
  if (IS_NODE) {
    if (backend !== 'auto' && backend !== 'cpu') {
      throw new Error(`in Node the backend is onnxruntime-node's cpu; got ${show(backend)}`);
    }
    try {
      return { ort: await import('onnxruntime-node'), backend: 'cpu' };
    } catch (e) {
      throw new Error(`onnxruntime-node is not installed here (${e.message}); run npm ci in web/`);
    }
  }
  let adapter = null;
  let reason = null;
  if (backend === 'auto' || backend === 'webgpu') {
    try {
      adapter = globalThis.navigator?.gpu ? await navigator.gpu.requestAdapter() : null;
      if (!adapter) reason = globalThis.navigator?.gpu ? 'the browser offers no WebGPU adapter' : 'this browser has no WebGPU';
    } catch (e) {
      reason = `WebGPU adapter request failed (${e.message})`;
    }
    if (!adapter && backend === 'webgpu') throw new Error(`backend webgpu was asked for, but ${reason}`);
  }
  const file = adapter ? 'ort.webgpu.min.mjs' : 'ort.wasm.min.mjs';
  const ort = await import(new URL(file, ortBase).href);
  ort.env.wasm.wasmPaths = new URL('./', ortBase).href;
  return { ort, backend: adapter ? 'webgpu' : 'wasm', noGpuReason: reason };
}

/** A bundle loaded for inference; `ViT.load(url)` makes one. */
export class ViT {
  constructor(fields) { Object.assign(this, fields); }

  /**
   * Load the bundle at `source` (a URL of its directory; in Node also a path).
   * options: precision ('fp32'), threads (default: ORT's, or what `vit-deploy web
   * --threads` wrote), backend ('auto' | 'webgpu' | 'wasm'; Node: 'cpu'), ortBase (URL of
   * the onnxruntime-web files; default ./ort/ beside this module), externalData
   * ([file names] beside the model; default: what `vit-deploy web` recorded).
   */
  static async load(source, options = {}) {
    const { precision = 'fp32', backend = 'auto' } = options;
    const base = bundleURL(source);
    const t0 = performance.now();
    const manifest = readManifest(await fetchJSON(new URL('manifest.json', base), 'manifest'),
      `manifest ${new URL('manifest.json', base).href}`);
    const web = await fetchJSON(new URL(WEB_RECORD, base), 'web record', { optional: true }) ?? {};
    const file = manifest.models[precision];
    if (typeof file !== 'string') {
      throw new BundleError(`bundle has no ${show(precision)} model; it has ${show(Object.keys(manifest.models).sort())}`);
    }
    const threads = options.threads ?? web.threads ?? null;
    if (threads !== null && !isInt(threads, 1)) throw new Error(`threads must be a positive integer, got ${show(threads)}`);
    const ortBase = options.ortBase ? new URL(options.ortBase, globalThis.location?.href) : new URL('./ort/', import.meta.url);
    const { ort, backend: chosen, noGpuReason } = await loadOrt(backend, ortBase);
    // names from the bundle (manifest, web.json) go through bundleFile: never outside it
    const external = options.externalData ?? await Promise.all(
      (web.external_data?.[precision] ?? []).map(async (name) => {
        await bundleFile(base, name, 'external data');
        return name;
      }));
    const modelURL = await bundleFile(base, file, `models[${show(precision)}]`);
    const sessionOptions = { graphOptimizationLevel: 'all' };
    let model;
    let downloaded = 0;
    if (IS_NODE) {
      sessionOptions.executionProviders = ['cpu'];
      if (threads) sessionOptions.intraOpNumThreads = threads;
      if (modelURL.protocol === 'file:') {
        const { fileURLToPath } = await import('node:url');
        model = fileURLToPath(modelURL); // onnxruntime-node finds external data beside it
      }
    } else {
      if (threads) ort.env.wasm.numThreads = threads;
      sessionOptions.executionProviders = [chosen];
    }
    if (model === undefined) {
      model = await fetchBytes(modelURL, 'model');
      downloaded += model.byteLength;
      if (external.length) {
        // onnxruntime-web does not look beside the model: each external file by name and URL
        sessionOptions.externalData = IS_NODE
          ? await Promise.all(external.map(async (path) => {
            const data = await fetchBytes(new URL(path, base), 'external data');
            downloaded += data.byteLength;
            return { path, data };
          }))
          : external.map((path) => ({ path, data: new URL(path, base).href }));
      }
    }
    const tFetched = performance.now();
    let session;
    let fallback = chosen === 'webgpu' || IS_NODE ? null : noGpuReason ?? null;
    let ranOn = chosen;
    try {
      session = await ort.InferenceSession.create(model, sessionOptions);
    } catch (e) {
      if (chosen !== 'webgpu' || backend === 'webgpu') throw new BundleError(`${modelURL.href}: ONNX Runtime could not create a session (${e.message})`);
      fallback = `WebGPU session failed (${e.message}); running on WebAssembly`;
      ranOn = 'wasm';
      session = await ort.InferenceSession.create(model, { ...sessionOptions, executionProviders: ['wasm'] });
    }
    model = null; // drop our copy: the session holds the weights now
    // the labels against the logits' real width (the graph's, where it fixes it; else
    // classify() checks each result), not the manifest's claim
    const width = session.outputMetadata?.find?.((o) => o.name === LOGITS)?.shape?.at(-1);
    if (manifest.labels && typeof width === 'number' && width !== manifest.labels.length) {
      await session.release?.();
      throw new BundleError(labelsMismatch(manifest.labels.length, width, LOGITS, modelURL.href));
    }
    const activeThreads = IS_NODE ? threads : (ranOn === 'wasm' ? ort.env.wasm.numThreads : null);
    let threadFallback = null;
    if (!IS_NODE && ranOn === 'wasm' && threads && threads > activeThreads) {
      threadFallback = globalThis.crossOriginIsolated
        ? `WebAssembly threads are not supported here: running on ${activeThreads} thread(s), not ${threads}`
        : `the page is not cross-origin isolated (the server sends no COOP/COEP headers): ` +
          `WebAssembly runs on ${activeThreads} thread, not ${threads}`;
    }
    const cpuWarning = await int8Warning(manifest.int8Cpu[precision]);
    if (cpuWarning) console.warn(`vit-deploy: ${cpuWarning}`);
    const info = {
      backend: IS_NODE ? 'onnxruntime-node' : 'onnxruntime-web',
      cpuWarning,
      provider: ranOn, // cpu (Node), wasm or webgpu
      precision,
      threadsRequested: threads,
      threads: activeThreads,
      threadFallback,
      fallback,
      crossOriginIsolated: IS_NODE ? null : !!globalThis.crossOriginIsolated,
      ortVersion: ort.env.versions?.common ?? null,
      modelBytes: downloaded || null,
      downloadMs: tFetched - t0,
      sessionMs: performance.now() - tFetched,
    };
    return new ViT({ ort, session, manifest, info, precision, url: base.href,
      preprocess: Preprocess.fromManifest(manifest) });
  }

  get labels() { return this.manifest.labels; }

  /** The model's output names, in order (the ONNX session's; the manifest's io.outputs). */
  get outputNames() { return [...(this.session?.outputNames ?? this.manifest.outputs)]; }

  /**
   * Raw logits for normalised pixels: `data` Float32Array of `dims` [B, 3, H, W]. As
   * Python's ViTSession.run: the `logits` output by name, or the first output of a bundle
   * without one (a backbone's `pooled`); `runAll` gives every output.
   */
  async run(data, dims) {
    const names = this.outputNames;
    const name = names.includes(LOGITS) ? LOGITS : names[0];
    return (await this.runAll(data, dims, [name]))[name].data;
  }

  /**
   * Outputs for normalised pixels (as `run`): { name: { data: Float32Array, dims } }, every
   * output or those named in `only`.
   */
  async runAll(data, dims, only = null) {
    if (!(data instanceof Float32Array)) throw new Error(`run() takes a Float32Array, got ${data?.constructor?.name}`);
    if (!Array.isArray(dims) || dims.length !== 4 || dims[1] !== 3 || !dims.every((d) => isInt(d, 1)) ||
      dims.reduce((a, b) => a * b, 1) !== data.length) {
      throw new Error(`run() takes dims [batch, 3, height, width] matching data's ${data.length} values, got ${show(dims)}`);
    }
    const [, , h, w] = dims;
    const P = this.manifest.patchSize;
    if (h % P || w % P) throw new Error(`height and width must be multiples of the patch size ${P}, got ${h}x${w}`);
    if (!this.manifest.dynamic && (h !== this.manifest.preprocess.resolution[0] || w !== this.manifest.preprocess.resolution[1])) {
      throw new Error(`this bundle is static at ${this.manifest.preprocess.resolution.join('x')}, cannot run ${h}x${w}`);
    }
    const names = only ?? this.outputNames;
    for (const name of names) this.#requireOutput(name);
    const input = new this.ort.Tensor('float32', data, dims);
    const outputs = await this.session.run({ [this.manifest.input]: input }, names);
    const result = {};
    for (const name of names) {
      const out = outputs[name];
      result[name] = { data: out.data instanceof Float32Array ? out.data : Float32Array.from(out.data),
        dims: Array.from(out.dims, Number) };
    }
    for (const t of Object.values(outputs)) t.dispose?.();
    for (const [name, out] of Object.entries(result)) { // every output is batch-first
      if (out.dims.length === 0 || out.dims[0] !== dims[0]) {
        throw new BundleError(`${this.url}: output ${show(name)} has dims ${show(out.dims)} for a batch of ` +
          `${dims[0]} image(s); expected ${dims[0]} row(s) (the graph does not keep the batch)`);
      }
    }
    return result;
  }

  #requireOutput(name, how = null) {
    const names = this.outputNames;
    if (names.includes(name)) return;
    const hint = how ? `; export with ${how}` : '';
    throw new BundleError(`${this.url} has no ${show(name)} output (outputs: ${show(names)})${hint}`);
  }

  /** The model input for an image: { data, dims } (see Preprocess.tensor). */
  async pixels(image, overrides = {}) {
    const pre = Object.keys(overrides).length ? Preprocess.fromManifest(this.manifest, overrides) : this.preprocess;
    return pre.tensor(await decodeImage(image));
  }

  /**
   * Classify one image: { top: [{ index, label, probability }], logits, inputSize: [H, W],
   * ms: { decode, preprocess, run }, provider }. Needs the bundle's `logits` output.
   */
  async classify(image, { topK: k = 5, ...overrides } = {}) {
    if (!this.outputNames.includes(LOGITS)) {
      throw new BundleError(`${this.url} has no ${show(LOGITS)} output to classify with (outputs: ` +
        `${show(this.outputNames)}): a backbone without a classifier; use features() or runAll()`);
    }
    const t0 = performance.now();
    const decoded = await decodeImage(image);
    const t1 = performance.now();
    const pre = Object.keys(overrides).length ? Preprocess.fromManifest(this.manifest, overrides) : this.preprocess;
    const { data, dims } = pre.tensor(decoded);
    const t2 = performance.now();
    const logits = requireFinite((await this.runAll(data, dims, [LOGITS]))[LOGITS].data, LOGITS);
    const t3 = performance.now();
    if (this.labels && logits.length !== this.labels.length) {
      throw new BundleError(labelsMismatch(this.labels.length, logits.length, LOGITS, this.url));
    }
    return { top: topK(logits, k, this.labels), logits, inputSize: [dims[2], dims[3]],
      ms: { decode: t1 - t0, preprocess: t2 - t1, run: t3 - t2 }, provider: this.info.provider };
  }

  /**
   * Dense features of one image, as Python's ViTSession.features: the grid output `output`
   * (patch_tokens, or layer_N) -> { data: Float32Array, dims: [1, D, gh, gw], output,
   * inputSize: [H, W], ms: { decode, preprocess, run }, provider }. The image is resized
   * with the rule patch_multiple whatever the manifest says (the shorter side to the
   * deploy resolution's shorter side, both sides patch multiples, aspect ratio kept, no
   * crop); other preprocessing overrides (resolution, interpolation, resize) as classify's.
   */
  async features(image, { output = PATCH_TOKENS, ...overrides } = {}) {
    if (typeof output !== 'string') throw new Error(`output must be an output name, got ${show(output)}`);
    if (!isGridOutput(output)) {
      const grid = this.outputNames.filter(isGridOutput);
      throw new Error(`output ${show(output)} is not laid out on the patch grid; features() takes ` +
        `one that is (patch_tokens or layer_N): this bundle has ${grid.length ? show(grid) : 'none'} ` +
        `(outputs: ${show(this.outputNames)})`);
    }
    this.#requireOutput(output, output === PATCH_TOKENS ? `--outputs ${PATCH_TOKENS}`
      : `--layers ${output.slice('layer_'.length)}`);
    const t0 = performance.now();
    const decoded = await decodeImage(image);
    const t1 = performance.now();
    const pre = Preprocess.fromManifest(this.manifest, { ...overrides,
      resize: overrides.resize ?? 'patch_multiple' });
    const { data, dims } = pre.tensor(decoded);
    const t2 = performance.now();
    const out = (await this.runAll(data, dims, [output]))[output];
    requireFinite(out.data, output);
    const t3 = performance.now();
    return { data: out.data, dims: out.dims, output, inputSize: [dims[2], dims[3]],
      ms: { decode: t1 - t0, preprocess: t2 - t1, run: t3 - t2 }, provider: this.info.provider };
  }

  async release() { await this.session?.release?.(); this.session = null; }
}
