// The ViT class: a bundle loaded for inference, on whichever platform a subclass names
// (bindPlatform, below: what each entry exports). Nothing here knows which platform it is.
import { checkReport, verifyReferences } from './check.mjs';
import {
  BundleError, checkThreads, checkTopK, createSession, guardMemory, isGridOutput, isInt, loaderOptions, LOGITS,
  METADATA_CONFIG_KEY, PATCH_TOKENS, show, WEB_RECORD,
} from './common.mjs';
import { decodeImage } from './decode.mjs';
import { embedImage } from './embedding.mjs';
import { bundleFile, int8Recipe, int8Warning, readManifest } from './manifest.mjs';
import { batchCoupled, int8WeightsNeed, modelMetadata } from './onnx-metadata.mjs';
import { Preprocess } from './preprocess.mjs';
import { labelsMismatch, requireFinite, topK } from './results.mjs';

function parseJSON(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new BundleError(`${what} is not valid JSON: ${e.message}`);
  }
}

async function readJSON(platform, url, what, { optional = false } = {}) {
  const text = await platform.readText(url, what, { optional });
  if (text === null) return null;
  return parseJSON(text, `${what} ${url.protocol === 'file:' ? url.pathname : url}`);
}

function bundleURL(source, platform) {
  if (source instanceof URL) return source.href.endsWith('/') ? source : new URL(`${source.href}/`);
  const text = String(source);
  const withSlash = text.endsWith('/') ? text : `${text}/`;
  if (/^[a-z][a-z0-9+.-]*:/i.test(text) && !/^[a-z]:[\\/]/i.test(text)) return new URL(withSlash);
  return platform.baseURL(withSlash);
}

/** A bundle loaded for inference; `ViT.load(url)` makes one. */
export class ViT {
  /** The platform module (platform-node.mjs or platform-browser.mjs): set by bindPlatform. */
  static platform = null;

  constructor(fields) { Object.assign(this, fields); }

  /**
   * Load the bundle at `source` (a URL of its directory; in Node also a path).
   * options: precision ('fp32'), threads (an integer from 1 to MAX_THREADS, 256, as
   * Python's RuntimeOptions; default: ORT's, or what `vit-deploy web --threads` wrote), backend ('auto' | 'webgpu' | 'wasm'; Node: 'cpu'), ortBase (URL of
   * the onnxruntime-web files; default ./ort/ beside the entry module), externalData
   * ([file names] beside the model; default: what `vit-deploy web` recorded), allowLarge
   * (default false: a size whose attention-memory estimate exceeds MEMORY_FRACTION of the
   * available memory is refused before anything is allocated for it, as Python's
   * RuntimeOptions.allow_large). The options are checked before anything is read.
   */
  static async load(source, options = {}) {
    const { platform, precision, backend, allowLarge } = loaderOptions(this, options);
    const base = bundleURL(source, platform);
    const t0 = performance.now();
    const raw = await readJSON(platform, new URL('manifest.json', base), 'manifest');
    const manifest = readManifest(raw, `manifest ${new URL('manifest.json', base).href}`);
    const web = await readJSON(platform, new URL(WEB_RECORD, base), 'web record', { optional: true }) ?? {};
    const file = Object.hasOwn(manifest.models, precision) ? manifest.models[precision] : null;
    if (typeof file !== 'string') {
      throw new BundleError(`bundle has no ${show(precision)} model; it has ${show(Object.keys(manifest.models).sort())}`);
    }
    let threads = options.threads ?? null;
    if (threads === null) { // what `vit-deploy web --threads` wrote: the bundle's word, checked
      try {
        threads = checkThreads(web.threads ?? null);
      } catch (e) {
        throw new BundleError(`web record ${new URL(WEB_RECORD, base).href}: ${e.message}`);
      }
    }
    const ortBase = options.ortBase ? new URL(options.ortBase, globalThis.location?.href) : new URL('../ort/', import.meta.url);
    const { ort, backend: chosen, noGpuReason, gpu } = await platform.loadOrt(backend, ortBase);
    // names from the bundle (manifest, web.json) go through bundleFile: never outside it
    const external = options.externalData ?? await Promise.all(
      (web.external_data?.[precision] ?? []).map(async (name) => {
        await bundleFile(base, name, 'external data', platform.insideBundle);
        return name;
      }));
    const modelURL = await bundleFile(base, file, `models[${show(precision)}]`, platform.insideBundle);
    const inputs = await platform.sessionInputs({ ort, backend: chosen, threads, modelURL, external, base });
    let { model } = inputs;
    const sessionOptions = { graphOptimizationLevel: 'all', ...inputs.options };
    const tFetched = performance.now();
    const { session, provider: ranOn, fallback } = await createSession(ort, model, sessionOptions,
      { chosen, backend, noGpuReason, where: modelURL.href });
    let cpuWarning, splitBatches;
    try { // the manifest against the config the exporter stored in the model file itself
      checkAgainstModel(manifest, await modelMetadata(await platform.modelReader(model)), modelURL);
      // int8 on a CPU that may saturate 8-bit weights: the file's own weights decide
      const file = model;
      cpuWarning = await int8Warning(manifest.int8Cpu[precision], {}, platform.cpu,
        async () => int8WeightsNeed(await platform.modelReader(file)));
      splitBatches = await batchCoupled(await platform.modelReader(model),
        int8Recipe(raw, precision)?.kind === 'dynamic');
    } catch (e) {
      await session.release?.();
      throw e;
    }
    model = null; // drop our copy: the session holds the weights now
    // the labels against the logits' real width (the graph's, where it fixes it; else
    // classify() checks each result), not the manifest's claim
    const width = session.outputMetadata?.find?.((o) => o.name === LOGITS)?.shape?.at(-1);
    if (manifest.labels && typeof width === 'number' && width !== manifest.labels.length) {
      await session.release?.();
      throw new BundleError(labelsMismatch(manifest.labels.length, width, LOGITS, modelURL.href));
    }
    if (cpuWarning) console.warn(`vit-deploy: ${cpuWarning}`);
    const { threads: activeThreads, threadFallback, crossOriginIsolated } = platform.threadInfo(
      { ort, provider: ranOn, threads });
    const info = {
      backend: platform.runtime,
      cpuWarning,
      provider: ranOn, // cpu (Node), wasm or webgpu
      precision,
      threadsRequested: threads,
      threads: activeThreads,
      threadFallback,
      fallback,
      crossOriginIsolated,
      ortVersion: ort.env.versions?.common ?? null,
      gpu: ranOn === 'webgpu' ? gpu : null, // the WebGPU adapter that ran (browser)
      modelBytes: inputs.downloaded || null,
      downloadMs: tFetched - t0,
      sessionMs: performance.now() - tFetched,
      // dynamic int8 quantises activations per tensor, coupling a batch's images: run them
      // one at a time (Python's Manifest.batch_coupled, ViTSession.split_batches)
      splitBatches,
    };
    return new this({ ort, session, manifest, info, precision, url: base.href, allowLarge,
      preprocess: Preprocess.fromManifest(manifest) });
  }

  /** The ONNX Runtime session, or an Error once release() has freed it. */
  #live() {
    if (!this.session) {
      throw new Error(`this ViT was released (release() freed its ONNX Runtime session): load ` +
        `${this.url} again with ViT.load to run it`);
    }
    return this.session;
  }

  /**
   * An Error unless this model takes a batch of height x width inputs: a static graph's
   * size, patch multiples, and (unless allowLarge) the attention-memory estimate against the
   * memory available (Python's ViTSession.check_size). Called before the input is
   * allocated (classify, features, pixels) and before every run.
   */
  async #checkSize(height, width, batch = 1) {
    const P = this.manifest.patchSize;
    const [sh, sw] = this.manifest.preprocess.resolution;
    if (!this.manifest.dynamic && (height !== sh || width !== sw)) {
      throw new Error(`this bundle is static at ${sh}x${sw}, cannot run ${height}x${width}`);
    }
    if (height % P || width % P) {
      throw new Error(`height and width must be multiples of the patch size ${P}, got ${height}x${width}`);
    }
    if (this.allowLarge) return;
    const available = await this.constructor.platform.availableMemory({ provider: this.info.provider });
    guardMemory(height, width, this.manifest.config, { batch, available });
  }

  /** The model input for decoded pixels under `pre`: its size checked before any pixel is
   * resized or allocated (Preprocess.plan refuses what no rule can make first). */
  async #input(decoded, pre) {
    const { target: [th, tw] } = pre.plan(decoded.width, decoded.height);
    await this.#checkSize(th, tw);
    return pre.tensor(decoded);
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
   * output or those named in `only`. A batch of dynamic int8 (info.splitBatches) runs one
   * image at a time, as Python's ViTSession.run_all: each image's outputs are its own.
   */
  async runAll(data, dims, only = null) {
    if (!(data instanceof Float32Array)) throw new Error(`run() takes a Float32Array, got ${data?.constructor?.name}`);
    if (!Array.isArray(dims) || dims.length !== 4 || dims[1] !== 3 || !dims.every((d) => isInt(d, 1)) ||
      dims.reduce((a, b) => a * b, 1) !== data.length) {
      throw new Error(`run() takes dims [batch, 3, height, width] matching data's ${data.length} values, got ${show(dims)}`);
    }
    this.#live();
    const [B] = dims;
    const split = this.info.splitBatches && B > 1;
    await this.#checkSize(dims[2], dims[3], split ? 1 : B);
    const names = only ?? this.outputNames;
    for (const name of names) this.#requireOutput(name);
    if (!split) return this.#runBatch(data, dims, names);
    const per = data.length / B;
    const parts = [];
    for (let b = 0; b < B; b++) {
      parts.push(await this.#runBatch(data.slice(b * per, (b + 1) * per), [1, ...dims.slice(1)], names));
    }
    return Object.fromEntries(names.map((name) => { // the images' rows, one after another
      const n = parts[0][name].data.length;
      const out = new Float32Array(B * n);
      parts.forEach((p, b) => out.set(p[name].data, b * n));
      return [name, { data: out, dims: [B, ...parts[0][name].dims.slice(1)] }];
    }));
  }

  /** One session run of a batch (`names` checked): every output batch-first. */
  async #runBatch(data, dims, names) {
    const input = new this.ort.Tensor('float32', data, dims);
    const outputs = await this.#live().run({ [this.manifest.input]: input }, names);
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
    return this.#input(await decodeImage(image, this.constructor.platform), pre);
  }

  /**
   * Classify one image: { top: [{ index, label, probability }], logits, inputSize: [H, W],
   * ms: { decode, preprocess, run }, provider }. Needs the bundle's `logits` output.
   */
  async classify(image, { topK: k = 5, ...overrides } = {}) {
    checkTopK(k);
    this.#live();
    const classifier = this.manifest.purpose?.classifier ?? null;
    if (!classifier || !this.outputNames.includes(classifier)) {
      throw new BundleError(`${this.url} has no ${show(LOGITS)} output to classify with (outputs: ` +
        `${show(this.outputNames)}): a backbone without a classifier; use embed() for its vectors, ` +
        'features() or runAll()');
    }
    const t0 = performance.now();
    const decoded = await decodeImage(image, this.constructor.platform);
    const t1 = performance.now();
    const pre = Object.keys(overrides).length ? Preprocess.fromManifest(this.manifest, overrides) : this.preprocess;
    const { data, dims } = await this.#input(decoded, pre);
    const t2 = performance.now();
    const logits = requireFinite((await this.runAll(data, dims, [classifier]))[classifier].data, classifier);
    const t3 = performance.now();
    if (this.labels && logits.length !== this.labels.length) {
      throw new BundleError(labelsMismatch(this.labels.length, logits.length, LOGITS, this.url));
    }
    return { top: topK(logits, k, this.labels, this.manifest.purpose?.probabilities), logits, inputSize: [dims[2], dims[3]],
      ms: { decode: t1 - t0, preprocess: t2 - t1, run: t3 - t2 }, provider: this.info.provider };
  }

  /** One image's embedding, unit length, as Python's ViTSession.embed (lib/embedding.mjs). */
  async embed(image, options = {}) { this.#live(); return embedImage(this, image, options); }

  /**
   * Dense features of one image, as Python's ViTSession.features: the grid output `output`
   * (patch_tokens, or layer_N) -> { data: Float32Array, dims: [1, D, gh, gw], output,
   * inputSize: [H, W], ms: { decode, preprocess, run }, provider }. The image is resized
   * with the rule patch_multiple whatever the manifest says (the shorter side to the
   * deploy resolution's shorter side, both sides patch multiples, aspect ratio kept, no
   * crop); other preprocessing overrides (resolution, interpolation, resize) as classify's.
   */
  async features(image, { output = PATCH_TOKENS, ...overrides } = {}) {
    this.#live();
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
    const decoded = await decodeImage(image, this.constructor.platform);
    const t1 = performance.now();
    const pre = Preprocess.fromManifest(this.manifest, { ...overrides,
      resize: overrides.resize ?? 'patch_multiple' });
    const { data, dims } = await this.#input(decoded, pre);
    const t2 = performance.now();
    const out = (await this.runAll(data, dims, [output]))[output];
    requireFinite(out.data, output);
    const t3 = performance.now();
    return { data: out.data, dims: out.dims, output, inputSize: [dims[2], dims[3]],
      ms: { decode: t1 - t0, preprocess: t2 - t1, run: t3 - t2 }, provider: this.info.provider };
  }

  /**
   * The bundle's golden references against this runtime (the precision and provider loaded):
   * every stored case's input regenerated from its seed, every declared output compared by
   * the tolerance policy; the report Python's `vit-deploy check --json` writes (schema
   * "vit-deploy-report" v1, kind "check"). `latencyRuns`: timed runs of the first case
   * (p50 / p90 in `latency`). A BundleError for a bundle without references.
   */
  async check({ latencyRuns = 0 } = {}) {
    this.#live();
    const refs = this.manifest.references;
    if (!refs) {
      throw new BundleError(`${this.url} has no golden references (its manifest has no ` +
        `"references"): re-export it with a vit-deploy that stores them, or check it in Python ` +
        `with torch (vit-deploy check)`);
    }
    const { platform } = this.constructor;
    const url = await bundleFile(new URL(this.url), refs.file, 'references', platform.insideBundle);
    const bytes = await platform.readBytes(url, 'references');
    await verifyReferences(bytes, refs, url);
    return checkReport(this, refs, bytes, { latencyRuns, device: platform.device(this.info),
      bundle: platform.bundleName(new URL(this.url)) });
  }

  /** Free the ONNX Runtime session; every run method after it is an Error saying so. */
  async release() {
    const { session } = this;
    this.session = null;
    await session?.release?.();
  }
}

/** A BundleError when the manifest's patch size or input channels contradict the config
 * the exporter stored in the model file (Python's ort_session._check_manifest_against_model);
 * nothing to compare in a foreign file. */
function checkAgainstModel(manifest, metadata, modelURL) {
  const text = metadata?.[METADATA_CONFIG_KEY];
  if (text === undefined) return;
  let stored;
  try {
    stored = JSON.parse(text);
  } catch (e) {
    throw new BundleError(`the model's stored vit-deploy config is not valid: ${e.message}`);
  }
  const real = (key, fallback) => (Object.hasOwn(stored ?? {}, key) ? stored[key] : fallback);
  for (const [what, claimed, value] of [['patch size', manifest.config.patchSize, real('patch_size', 16)],
    ['input channels', manifest.config.inChans, real('in_chans', 3)]]) {
    if (!isInt(value, 1)) {
      throw new BundleError(`the model's stored vit-deploy config is not valid: its ${what} is ${show(value)}`);
    }
    if (claimed !== value) {
      throw new BundleError(`the manifest says ${what} ${claimed}, but ${modelURL.href} was exported ` +
        `with ${what} ${value} (its metadata ${show(METADATA_CONFIG_KEY)}); the manifest does not ` +
        'describe this model');
    }
  }
}

/** The public names whose work depends on the platform, bound to `platform` (a platform
 * module's namespace): what an entry exports beside api.mjs. */
export function bindPlatform(platform) {
  const Base = ViT;
  return {
    ViT: class ViT extends Base { static platform = platform; },
    decodeImage: (src) => decodeImage(src, platform),
    bundleFile: (base, name, what) => bundleFile(base, name, what, platform.insideBundle),
    int8Warning: (need, facts, fromFile) => int8Warning(need, facts, platform.cpu, fromFile),
  };
}
