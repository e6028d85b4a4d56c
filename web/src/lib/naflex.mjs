// SigLIP 2 NaFlex (native aspect ratio) in JavaScript: the exported NaFlex graph
// (export/naflex/bundle.py's model.onnx) in ONNX Runtime, as Python's
// runtime/naflex/session.py; its preprocessing (runtime/naflex/preprocess.py) is
// naflex-preprocess.mjs.
// Golden references (naflex_references) are checked by check() (check.mjs judges them).
// Shapes in comments: B batch, N maxNumPatches, P patch, C channels (3), D width.
import { naflexCheckReport, naflexReferences, verifyReferences } from './check.mjs';
import {
  BundleError, checkThreads, createSession, guardTokens, isInt, loaderOptions, METADATA_CONFIG_KEY, show,
} from './common.mjs';
import { decodeImage } from './decode.mjs';
import { bundleFile, int8Recipe } from './manifest.mjs';
import { ATTENTION_MASK, LAST_HIDDEN, MAX_PATCH, NAFLEX_INPUTS, NAFLEX_OUTPUTS, NaFlexPreprocess, PIXEL_VALUES, POOLED,
  SPATIAL_SHAPES } from './naflex-preprocess.mjs';
import { batchCoupled, modelMetadata } from './onnx-metadata.mjs';

export * from './naflex-preprocess.mjs';

const MANIFEST = 'manifest.json';
const WEB_RECORD = 'web.json'; // `vit-deploy web`'s record beside a site's manifest

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
    const { platform, precision, backend, allowLarge } = loaderOptions(this, options);
    const given = Object.fromEntries(['maxNumPatches', 'mean', 'std'].filter((k) => options[k] !== undefined)
      .map((k) => [k, options[k]]));
    new NaFlexPreprocess(given); // checked before reading
    const { url, external, manifest, base } = await locate(model, platform, precision);
    const threads = checkThreads(options.threads ?? manifest?.threads ?? null);
    const ortBase = options.ortBase ? new URL(options.ortBase, globalThis.location?.href) : new URL('../ort/', import.meta.url);
    const { ort, backend: chosen, noGpuReason, gpu } = await platform.loadOrt(backend, ortBase);
    const inputs = await platform.sessionInputs({ ort, backend: chosen, threads, modelURL: url, external, base: new URL('./', url) });
    const sessionOptions = { graphOptimizationLevel: 'all', ...inputs.options };
    const { session, provider, fallback } = await createSession(ort, inputs.model, sessionOptions,
      { chosen, backend, noGpuReason, where: url.href }); // as ViT.load: WebGPU, else WebAssembly
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
    // heads and width for the attention-memory guard: the config the exporter stored in the
    // graph (Python's NaFlexSession reads the same); every image fills its budget, so a
    // budget whose attention cannot fit is refused before any image is read
    const attention = attentionConfig(await modelMetadata(await platform.modelReader(inputs.model)));
    const guard = async (tokens, batch, what, advice) => {
      if (allowLarge || attention === null) return;
      guardTokens(tokens, attention, { batch, what, advice, available: await platform.availableMemory({ provider }) });
    };
    try {
      await guard(preprocess.maxNumPatches, 1, `maxNumPatches ${preprocess.maxNumPatches}`, 'a smaller maxNumPatches');
    } catch (e) {
      await session.release?.();
      throw e;
    }
    return new this({ ort, session, preprocess, manifest, guard, precision: manifest ? precision : null, url: url.href,
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
    const [B, N] = batch.pixelValues.dims;
    await this.guard(N, this.info.splitBatches ? 1 : B, `pixel_values [${batch.pixelValues.dims}]`,
      'fewer patches per image');
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

// { heads, width } of the config the exporter stored in the graph's metadata; null where the
// file carries none (a foreign graph: nothing to estimate with, as Python's would refuse it).
function attentionConfig(metadata) {
  try {
    const c = JSON.parse(metadata?.[METADATA_CONFIG_KEY] ?? 'null');
    return isInt(c?.heads, 1) && isInt(c?.width, 1) ? { heads: c.heads, width: c.width } : null;
  } catch {
    return null;
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
