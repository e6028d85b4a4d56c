// SigLIP 2 NaFlex (native aspect ratio) in JavaScript: vit_deploy/runtime/naflex.py's
// preprocessing, the same floats as transformers' Siglip2ImageProcessor(Pil), and the
// exported NaFlex graph (export/naflex_bundle.py's model.onnx) in ONNX Runtime, as Python's
// runtime/naflex_session.py.
//
// NaFlex keeps each image's aspect ratio: it is resized (Pillow's bilinear, antialiased on
// downscale: resample.mjs, as the NCHW path) to the largest patch grid (gh, gw) of at most
// maxNumPatches patches, flattened (row, column, channel) in raster order and padded with
// zeros to maxNumPatches; a mask marks the real patches: any aspect ratios share one batch.
// Golden references (naflex_references) are checked by check() (check.mjs judges them).
// Shapes in comments: B batch, N maxNumPatches, P patch, C channels (3), D width.
import { naflexCheckReport, naflexReferences, verifyReferences } from './check.mjs';
import { BundleError, checkThreads, isInt, show } from './common.mjs';
import { decodeImage } from './decode.mjs';
import { bundleFile, checkNormalization, int8Recipe } from './manifest.mjs';
import { batchCoupled } from './onnx-metadata.mjs';
import { toRGB } from './preprocess.mjs';
import { resize } from './resample.mjs';

// The graph's contract (runtime/naflex.py): transformers' input names.
export const PIXEL_VALUES = 'pixel_values'; // (B, N, C*P*P) float32, normalised patches
export const ATTENTION_MASK = 'pixel_attention_mask'; // (B, N) int32: 1 real, 0 padding
export const SPATIAL_SHAPES = 'spatial_shapes'; // (B, 2) int64: each image's (gh, gw)
export const NAFLEX_INPUTS = [PIXEL_VALUES, ATTENTION_MASK, SPATIAL_SHAPES];
export const POOLED = 'pooled'; // (B, D) float32: the attention-pooled embedding
export const LAST_HIDDEN = 'last_hidden_state'; // (B, N, D): padding rows meaningless
export const NAFLEX_OUTPUTS = [POOLED, LAST_HIDDEN];
export const MAX_NUM_PATCHES = 256; // Siglip2ImageProcessor's default
export const PATCH_BUDGET_LIMIT = 65_536; // of maxNumPatches: 200 MB of float32 per image at patch 16
const MAX_PATCH = 1024;
const SEARCH_EPS = 1e-5; // transformers' get_image_size_for_max_num_patches: binary-search step
const MANIFEST = 'manifest.json';
const WEB_RECORD = 'web.json'; // `vit-deploy web`'s record beside a site's manifest

/**
 * [H, W] a height x width image is resized to: transformers'
 * get_image_size_for_max_num_patches, the same binary search over the scale in the same
 * IEEE doubles as Python's, so the same sizes.
 */
export function sizeForMaxNumPatches(height, width, patch, maxNumPatches) {
  const scaled = (scale, size) => Math.max(patch, Math.ceil(size * scale / patch) * patch);
  let lo = SEARCH_EPS / 10;
  let hi = 100.0;
  while (hi - lo >= SEARCH_EPS) {
    const scale = (lo + hi) / 2;
    if ((scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= maxNumPatches) lo = scale;
    else hi = scale;
  }
  return [scaled(lo, height), scaled(lo, width)];
}

/**
 * Images -> the graph's three inputs, as Python's NaFlexPreprocess (Siglip2ImageProcessor's
 * defaults: bilinear with Pillow's antialiasing filter, 1/255, mean = std = 0.5).
 */
export class NaFlexPreprocess {
  constructor({ patchSize = 16, maxNumPatches = MAX_NUM_PATCHES, mean = [0.5, 0.5, 0.5],
    std = [0.5, 0.5, 0.5], scale = 1 / 255 } = {}) {
    for (const [name, v, limit] of [['patchSize', patchSize, MAX_PATCH],
      ['maxNumPatches', maxNumPatches, PATCH_BUDGET_LIMIT]]) {
      if (!(isInt(v, 1) && v <= limit)) throw new Error(`${name} must be an integer from 1 to ${limit}, got ${show(v)}`);
    }
    checkNormalization(mean, std, { scale });
    if (mean.length !== 1 && mean.length !== 3) {
      throw new Error(`mean and std must hold 1 or 3 values (RGB), got ${mean.length}`);
    }
    Object.assign(this, { patchSize, maxNumPatches, mean: [...mean], std: [...std], scale });
    this.lut = this.#table();
    Object.freeze(this);
  }

  // transformers' Pillow backend: x * scale in float64, cast to float32, then (x - mean) /
  // std in float32. A function of the byte and the channel: a table of 3 x 256 floats.
  // (A float32 operation done in doubles and rounded once is the float32 result: a double
  // holds more than 2 x 24 + 2 bits.)
  #table() {
    const f = Math.fround;
    const lut = new Float32Array(3 * 256);
    for (let c = 0; c < 3; c++) {
      const mean = f(this.mean[this.mean.length === 1 ? 0 : c]);
      const std = f(this.std[this.std.length === 1 ? 0 : c]);
      for (let v = 0; v < 256; v++) lut[c * 256 + v] = f(f(f(v * this.scale) - mean) / std);
    }
    return lut;
  }

  /** [gh, gw]: the patch grid a width x height image gets. */
  grid(width, height) {
    const [h, w] = sizeForMaxNumPatches(height, width, this.patchSize, this.maxNumPatches);
    return [h / this.patchSize, w / this.patchSize];
  }

  /**
   * Decoded pixels { data, width, height, channels? } (RGBA, alpha composited on white, or
   * RGB) -> { data: Float32Array (gh * gw, P*P*C), grid: [gh, gw] }; into `out` (from its
   * start) when given.
   */
  patches(image, out = null) {
    const { data: rgb, width, height } = toRGB(image);
    const P = this.patchSize;
    const [gh, gw] = this.grid(width, height);
    const W = gw * P;
    const pixels = resize(rgb, width, height, W, gh * P, 'bilinear'); // (gh*P, gw*P, C) bytes
    const row = P * P * 3; // one patch: (P, P, C)
    const data = out ?? new Float32Array(gh * gw * row);
    if (data.length < gh * gw * row) {
      throw new Error(`patches need ${gh * gw * row} values, the output holds ${data.length}`);
    }
    const { lut } = this;
    for (let i = 0; i < gh; i++) {
      for (let j = 0; j < gw; j++) {
        let o = (i * gw + j) * row; // patch (i, j), raster order
        for (let y = 0; y < P; y++) {
          let p = ((i * P + y) * W + j * P) * 3;
          for (let k = 0; k < P * 3; k++, p++, o++) data[o] = lut[(p % 3) * 256 + pixels[p]];
        }
      }
    }
    return { data, grid: [gh, gw] };
  }

  /**
   * Decoded images (any sizes and aspect ratios; one, or an array) -> one batch padded to
   * maxNumPatches: { pixelValues, pixelAttentionMask, spatialShapes }, each { data, dims }
   * (Float32Array (B, N, C*P*P), Int32Array (B, N), BigInt64Array (B, 2)).
   */
  batch(images) {
    const list = Array.isArray(images) ? images : [images];
    if (!list.length) throw new Error('expected at least one image, got none');
    const B = list.length;
    const N = this.maxNumPatches;
    const D = this.patchSize * this.patchSize * 3;
    const values = new Float32Array(B * N * D);
    const mask = new Int32Array(B * N);
    const shapes = new BigInt64Array(B * 2);
    list.forEach((image, b) => {
      const { grid: [gh, gw] } = this.patches(image, values.subarray(b * N * D, (b + 1) * N * D));
      mask.fill(1, b * N, b * N + gh * gw);
      shapes[b * 2] = BigInt(gh);
      shapes[b * 2 + 1] = BigInt(gw);
    });
    return { pixelValues: { data: values, dims: [B, N, D] },
      pixelAttentionMask: { data: mask, dims: [B, N] },
      spatialShapes: { data: shapes, dims: [B, 2] } };
  }
}

// A model given as a path or URL: { file } for an .onnx file, { dir } for a folder (a
// bundle with its manifest.json, a site's bundle/, or a folder holding model.onnx).
function modelLocation(model, platform) {
  if (model instanceof URL) return model.pathname.endsWith('.onnx') ? { file: model } : { dir: new URL(`${model.href.replace(/\/$/, '')}/`) };
  const text = String(model);
  const url = /^[a-z][a-z0-9+.-]*:/i.test(text) && !/^[a-z]:[\\/]/i.test(text);
  if (!text.endsWith('.onnx')) {
    const dir = text.endsWith('/') ? text : `${text}/`;
    return { dir: url ? new URL(dir) : platform.baseURL(dir) };
  }
  if (url) return { file: new URL(text) };
  const cut = Math.max(text.lastIndexOf('/'), text.lastIndexOf('\\')) + 1;
  return { file: new URL(encodeURIComponent(text.slice(cut)), platform.baseURL(text.slice(0, cut) || '.')) };
}

async function readJSON(platform, url, what, { optional = false } = {}) {
  const text = await platform.readText(url, what, { optional });
  try {
    return text === null ? null : JSON.parse(text);
  } catch (e) {
    throw new BundleError(`${what} ${url.href} is not valid JSON: ${e.message}`);
  }
}

/**
 * What NaFlex reads of a NaFlex bundle's manifest (runtime/manifest.py, preprocess resize
 * "naflex"): { patchSize, maxNumPatches, mean, std, scale, models, name }.
 */
export function naflexManifest(m, where = 'manifest') {
  const pre = m?.preprocess ?? {};
  if (pre.resize !== 'naflex') {
    throw new BundleError(`${where}: not a NaFlex bundle (preprocess.resize is ${show(pre.resize)}, ` +
      `expected "naflex"); load it with ViT.load`);
  }
  const models = m.models ?? {};
  if (typeof models !== 'object' || Array.isArray(models) || !Object.values(models).every((f) => typeof f === 'string')) {
    throw new BundleError(`${where}: models must map precisions to files, got ${show(models)}`);
  }
  const fields = { patchSize: m.io?.patch_size, maxNumPatches: pre.max_num_patches, mean: pre.mean,
    std: pre.std, scale: pre.scale ?? 1 / 255 };
  try {
    new NaFlexPreprocess(fields); // the same bounds as options
  } catch (e) {
    throw new BundleError(`${where}: ${e.message}`);
  }
  return { ...fields, models: { ...models }, name: m.config?.name ?? null };
}

// { url, external, manifest } of the model to load: an .onnx file as given; a folder's
// manifest.json (its `precision` model, web.json's external data) when it has one, else its
// model.onnx (as Python's NaFlexSession).
async function locate(model, platform, precision) {
  const { file, dir } = modelLocation(model, platform);
  if (file) return { url: file, external: [], manifest: null };
  const where = new URL(MANIFEST, dir);
  const m = await readJSON(platform, where, 'manifest', { optional: true });
  if (m === null) return { url: new URL('model.onnx', dir), external: [], manifest: null };
  const manifest = naflexManifest(m, `manifest ${where.href}`);
  const name = Object.hasOwn(manifest.models, precision) ? manifest.models[precision] : null;
  if (name === null) {
    throw new BundleError(`bundle has no ${show(precision)} model; it has ${show(Object.keys(manifest.models).sort())}`);
  }
  const web = await readJSON(platform, new URL(WEB_RECORD, dir), 'web record', { optional: true }) ?? {};
  const external = await Promise.all((web.external_data?.[precision] ?? []).map(async (f) => {
    await bundleFile(dir, f, 'external data', platform.insideBundle);
    return f;
  }));
  const url = await bundleFile(dir, name, `models[${show(precision)}]`, platform.insideBundle);
  return { url, external, base: dir, manifest: { ...manifest, precision, threads: web.threads ?? null,
    references: naflexReferences(m, NAFLEX_OUTPUTS, `manifest ${where.href}`), // checked; null: none
    batchCoupled: int8Recipe(m, precision)?.kind === 'dynamic' } }; // Python's Manifest.batch_coupled
}

/** A NaFlex graph loaded for inference; `NaFlex.load(model)` makes one. */
export class NaFlex {
  /** The platform module: set by bindNaFlex (what each entry exports). */
  static platform = null;

  constructor(fields) { Object.assign(this, fields); }

  /**
   * Load a NaFlex model: a path or URL of a NaFlex bundle (its manifest.json: mean, std,
   * scale, patch size and max_num_patches from it; a site's bundle/ too), of a model.onnx,
   * or of a folder holding one. options: precision (a bundle's model, 'fp32'),
   * maxNumPatches (each image's patch budget: the manifest's, else 256), mean and std (the
   * manifest's, else SigLIP 2's 0.5), threads, backend ('auto' | 'webgpu' | 'wasm'; Node:
   * 'cpu'), ortBase (browser: URL of the onnxruntime-web files). The patch size is read from
   * the graph's pixel_values input (and must be the manifest's).
   */
  static async load(model, options = {}) {
    const { platform } = this;
    if (!platform) throw new Error('NaFlex has no platform: import it from vit-deploy.mjs, node.mjs or browser.mjs');
    const { precision = 'fp32', backend = 'auto' } = options;
    const given = Object.fromEntries(['maxNumPatches', 'mean', 'std'].filter((k) => options[k] !== undefined)
      .map((k) => [k, options[k]]));
    new NaFlexPreprocess(given); // checked before reading
    const { url, external, manifest, base } = await locate(model, platform, precision);
    const threads = checkThreads(options.threads ?? manifest?.threads ?? null);
    const ortBase = options.ortBase ? new URL(options.ortBase, globalThis.location?.href) : new URL('../ort/', import.meta.url);
    const { ort, backend: chosen, noGpuReason, gpu } = await platform.loadOrt(backend, ortBase);
    const inputs = await platform.sessionInputs({ ort, backend: chosen, threads, modelURL: url, external, base: new URL('./', url) });
    const sessionOptions = { graphOptimizationLevel: 'all', ...inputs.options };
    let session;
    let provider = chosen;
    let fallback = chosen === 'webgpu' ? null : noGpuReason ?? null;
    try {
      session = await ort.InferenceSession.create(inputs.model, sessionOptions);
    } catch (e) {
      if (chosen !== 'webgpu' || backend === 'webgpu') throw new BundleError(`${url.href}: ONNX Runtime could not create a session (${e.message})`);
      provider = 'wasm'; // as ViT.load: WebGPU failed, WebAssembly runs it
      fallback = `WebGPU session failed (${e.message}); running on WebAssembly`;
      session = await ort.InferenceSession.create(inputs.model, { ...sessionOptions, executionProviders: ['wasm'] });
    }
    const names = [[...session.inputNames], [...session.outputNames]];
    const patchSize = patchSizeOf(session);
    if (JSON.stringify(names) !== JSON.stringify([NAFLEX_INPUTS, NAFLEX_OUTPUTS]) || patchSize === null ||
      (manifest && patchSize !== manifest.patchSize)) {
      await session.release?.();
      throw new BundleError(`${url.href} is not a NaFlex graph: expected inputs ${show(NAFLEX_INPUTS)}, ` +
        `outputs ${show(NAFLEX_OUTPUTS)} and ${PIXEL_VALUES} ending in 3 x patch x patch` +
        `${manifest ? ` (patch ${manifest.patchSize}, the manifest's)` : ''}; got inputs ` +
        `${show(names[0])}, outputs ${show(names[1])}, patch ${show(patchSize)} (export it with export_naflex)`);
    }
    const fields = manifest ? { maxNumPatches: manifest.maxNumPatches, mean: manifest.mean, std: manifest.std, scale: manifest.scale } : {};
    const preprocess = new NaFlexPreprocess({ ...fields, ...given, patchSize });
    return new this({ ort, session, preprocess, manifest, precision: manifest ? precision : null, url: url.href,
      bundle: base?.href ?? null, info: { backend: platform.runtime, provider, threads, fallback,
        ortVersion: ort.env.versions?.common ?? null, gpu: provider === 'webgpu' ? gpu ?? null : null,
        splitBatches: await batchCoupled(await platform.modelReader(inputs.model), manifest?.batchCoupled ?? false) } });
  }

  /** The session, or an Error once release() has freed it. */
  #live() {
    if (!this.session) throw new Error(`${this.url}: this NaFlex model was released`);
    return this.session;
  }

  /**
   * The graph on a prepared batch (NaFlexPreprocess.batch) -> { pooled: { data, dims: [B, D] },
   * last_hidden_state: { data, dims: [B, N, D] } }. Dynamic int8 quantises activations per
   * tensor, coupling a batch's images: it runs them one at a time (info.splitBatches), as
   * Python's NaFlexSession.
   */
  async run(batch) {
    const B = batch.pixelValues.dims[0];
    if (!this.info.splitBatches || B === 1) return this.#run(batch);
    const rows = []; // each image's outputs, then (B, ...) again
    for (let b = 0; b < B; b++) {
      rows.push(await this.#run(Object.fromEntries(Object.entries(batch).map(([k, { data, dims }]) =>
        [k, { data: data.slice(b * (data.length / B), (b + 1) * (data.length / B)), dims: [1, ...dims.slice(1)] }]))));
    }
    return Object.fromEntries(NAFLEX_OUTPUTS.map((name) => {
      const { data: first, dims } = rows[0][name];
      const data = new Float32Array(B * first.length);
      rows.forEach((r, b) => data.set(r[name].data, b * first.length));
      return [name, { data, dims: [B, ...dims.slice(1)] }];
    }));
  }

  async #run({ pixelValues, pixelAttentionMask, spatialShapes }) {
    const session = this.#live();
    const { Tensor } = this.ort;
    const feeds = { [PIXEL_VALUES]: new Tensor('float32', pixelValues.data, pixelValues.dims),
      [ATTENTION_MASK]: new Tensor('int32', pixelAttentionMask.data, pixelAttentionMask.dims),
      [SPATIAL_SHAPES]: new Tensor('int64', spatialShapes.data, spatialShapes.dims) };
    const outputs = await session.run(feeds);
    const result = {};
    for (const name of NAFLEX_OUTPUTS) {
      const out = outputs[name];
      result[name] = { data: out.data instanceof Float32Array ? out.data : Float32Array.from(out.data),
        dims: Array.from(out.dims, Number) };
      out.dispose?.();
    }
    return result;
  }

  /**
   * Images (decoded pixels; in Node also paths or PNG / JPEG bytes; in the browser what
   * decodeImage takes), one or an array of any sizes, in one batch -> { pooled: { data,
   * dims: [B, D] }, tokens: [{ data, dims: [gh, gw, D] }] (each image's patch tokens on its
   * own grid, padding dropped), grids: [[gh, gw]], ms: { decode, preprocess, run } }.
   */
  async features(images) {
    this.#live();
    const list = Array.isArray(images) ? images : [images];
    const t0 = performance.now();
    const decoded = await Promise.all(list.map((src) => decodeImage(src, this.constructor.platform)));
    const t1 = performance.now();
    const batch = this.preprocess.batch(decoded);
    const t2 = performance.now();
    const out = await this.run(batch);
    const t3 = performance.now();
    const last = out[LAST_HIDDEN];
    const [, N, D] = last.dims;
    const grids = list.map((_, b) => [Number(batch.spatialShapes.data[b * 2]), Number(batch.spatialShapes.data[b * 2 + 1])]);
    const tokens = grids.map(([gh, gw], b) => ({ data: last.data.slice(b * N * D, (b * N + gh * gw) * D), dims: [gh, gw, D] }));
    return { pooled: out[POOLED], tokens, grids, ms: { decode: t1 - t0, preprocess: t2 - t1, run: t3 - t2 } };
  }

  /** The bundle's golden references (naflex_references) against the precision and provider
   * loaded, as Python's `vit-deploy check --reference bundle` (check.mjs's naflexCheckReport),
   * preprocessed by the bundle's rule whatever load() was given -> the report (schema
   * "vit-deploy-report" v1, kind "check"); `latencyRuns` timed runs of the first case. */
  async check({ latencyRuns = 0 } = {}) {
    this.#live();
    const refs = this.manifest?.references ?? null;
    if (!refs?.cases.length) {
      throw new BundleError(`${this.bundle ?? this.url} has no NaFlex golden references (${!this.manifest
        ? 'a bare model.onnx: load its bundle' : refs ? 'its manifest lists no cases' : 'its manifest has no ' +
        '"naflex_references"'}): export it again with \`vit-deploy export --naflex\`, or check it against PyTorch (vit-deploy check)`);
    }
    const { platform } = this.constructor;
    const base = new URL(this.bundle);
    const url = await bundleFile(base, refs.file, 'references', platform.insideBundle);
    const bytes = await platform.readBytes(url, 'references');
    await verifyReferences(bytes, refs, url);
    const { patchSize, maxNumPatches, mean, std, scale } = this.manifest; // the bundle's rule
    const pre = new NaFlexPreprocess({ patchSize, maxNumPatches, mean, std, scale });
    return naflexCheckReport(this, pre, refs, bytes, { latencyRuns, masked: LAST_HIDDEN,
      device: platform.device(this.info), bundle: platform.bundleName(base) });
  }

  /** Frees the session; the model cannot run after this. */
  async release() {
    const { session } = this;
    this.session = null;
    await session?.release?.();
  }
}

// P from the graph's pixel_values input (B, N, 3*P*P); null when the graph does not say.
function patchSizeOf(session) {
  const meta = session.inputMetadata?.find?.((m) => m.name === PIXEL_VALUES);
  const last = meta?.shape?.at?.(-1);
  const P = Math.round(Math.sqrt(last / 3));
  return isInt(last, 3) && 3 * P * P === last && P <= MAX_PATCH ? P : null;
}

/** NaFlex and naflexFeatures bound to `platform` (a platform module's namespace). */
export function bindNaFlex(platform) {
  const Base = NaFlex;
  const Bound = class NaFlex extends Base { static platform = platform; };
  /** Load, compute features(images), release: one batch of any aspect ratios. */
  async function naflexFeatures(model, images, options = {}) {
    const naflex = await Bound.load(model, options);
    try {
      return await naflex.features(images);
    } finally {
      await naflex.release();
    }
  }
  return { NaFlex: Bound, naflexFeatures };
}
