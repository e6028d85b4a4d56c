// What every module shares: the bundle contract's constants (each one Python's, as
// tests/website/test_web_constants.py checks), the errors, and the small checks they are built on.

export const BUNDLE_FORMAT = 'vit-deploy-bundle';
export const BUNDLE_FORMAT_VERSION = 2; // the newest manifest format this module reads
export const RESIZE_RULES = ['shorter_side_center_crop', 'patch_multiple', 'squash'];
export const MIN_CROP_PCT = 0.1; // a crop_pct resizes to side / crop_pct first: at most 10x
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
// int8 and the CPU (runtime/cpu.py): x86 flags whose kernels sum u8 x s8 products in 32
// bits; x86 with AVX2 only saturates the 16-bit pair sums of 8-bit weights (a recipe with
// cpu 'vnni'), ARM64 does not
export const X86_INT8_EXACT = ['avx512_vnni', 'avx_vnni', 'amx_int8'];
export const INT8_CPUS = ['any', 'vnni'];
// The runtime's bounds on what a caller or a bundle asks for (tests/test_hostile_table.py ties
// each to Python's; not exported by the entries): intra-op threads (runtime/ort_session.py's
// MAX_THREADS, the CLI's --threads), and the share of the available memory one encoder
// block's attention may take (runtime/sizes.py's MEMORY_FRACTION, guard_memory).
export const MAX_THREADS = 256;
export const MEMORY_FRACTION = 0.8;
// The key under which the exporter stores the model's config in every ONNX file's metadata
// (runtime/contract.py's METADATA_CONFIG_KEY): what a manifest's claims are checked against.
export const METADATA_CONFIG_KEY = 'vit_deploy.config';

/** Outputs laid out on the patch grid, [batch, width, gh, gw]: patch_tokens and layer_N
 * (vit_deploy/outputs.py's is_grid_output). */
export const isGridOutput = (name) => name === PATCH_TOKENS || /^layer_[0-9]+$/.test(name);

/** A bundle that cannot be used: says which file and why. */
export class BundleError extends Error {
  constructor(message) { super(message); this.name = 'BundleError'; }
}

/** An input that is not a usable image: says which one and why. */
export class ImageError extends Error {
  constructor(message) { super(message); this.name = 'ImageError'; }
}

/** A model output that is no result (NaN or ±Inf): says which output and how many. */
export class OutputError extends Error {
  constructor(message) { super(message); this.name = 'OutputError'; }
}

/** A value as an error message quotes it: JSON, at most 60 characters (NaN and ±Infinity,
 * which JSON writes as null, by name). */
export const show = (v) => {
  if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s.slice(0, 60);
};
export const isInt = (v, low = 0) => Number.isInteger(v) && v >= low;
export const isReal = (v) => typeof v === 'number' && Number.isFinite(v);

/** `threads` unless it is not an integer from 1 to MAX_THREADS (a bool, a fraction, NaN, a
 * string, 0, 100000): then an Error saying so, as Python's RuntimeOptions. null: unset. */
export function checkThreads(threads, where = '') {
  if (threads === null || isInt(threads, 1) && threads <= MAX_THREADS) return threads;
  throw new Error(`${where}threads must be an integer from 1 to ${MAX_THREADS} (or unset: ` +
    `ONNX Runtime's default), got ${show(threads)}`);
}

/** `k` unless it is not an integer >= 1 (as Python's predict top_k): then an Error. */
export function checkTopK(k) {
  if (isInt(k, 1)) return k;
  throw new Error(`topK must be an integer >= 1, got ${show(k)}`);
}

/**
 * Peak working memory of one encoder block, in bytes (Python's sizes.attention_bytes): the
 * attention scores and their softmax (2 x heads x T^2) plus the block's activations
 * (about 8 x T x D), float32, per image. T counts every token attention sees: the patches and
 * all prefix tokens (class, distillation, registers). `config`: the manifest's
 * { patchSize, heads, width, prefixTokens }.
 */
export function attentionBytes(height, width, config, batch = 1) {
  return tokenBytes(tokensOf(height, width, config), config, batch);
}

/** attentionBytes for a sequence of `tokens` (a NaFlex batch: its padded patch count). */
export function tokenBytes(tokens, config, batch = 1) {
  return batch * 4 * (2 * config.heads * tokens ** 2 + 8 * tokens * config.width);
}

const tokensOf = (height, width, { patchSize: P, prefixTokens }) =>
  Math.floor(height / P) * Math.floor(width / P) + prefixTokens;

/**
 * An Error (Python's guard_memory message) when the attention estimate for a batch of
 * height x width inputs exceeds `fraction` of `available` bytes (null: unknown, no limit);
 * else the estimate in bytes.
 */
export function guardMemory(height, width, config, { batch = 1, available = null,
  fraction = MEMORY_FRACTION } = {}) {
  return guardTokens(tokensOf(height, width, config), config,
    { batch, available, fraction, what: `${height}x${width} (batch ${batch})` });
}

/**
 * guardMemory for a sequence of `tokens` per image (Python's sizes.guard_tokens): `what`
 * names where they come from, `advice` what to use instead.
 */
export function guardTokens(tokens, config, { batch = 1, available = null,
  fraction = MEMORY_FRACTION, what, advice = 'a smaller size' } = {}) {
  const need = tokenBytes(tokens, config, batch);
  if (available !== null && need > fraction * available) {
    const gib = (n) => (n / 2 ** 30).toFixed(1);
    throw new Error(`${what} means ${tokens} tokens: attention needs about ${gib(need)} GiB, ` +
      `and ${gib(available)} GiB are available; use ${advice} (or allowLarge: true to try anyway)`);
  }
  return need;
}

/**
 * A backend option as an order of preference, as Python's provider lists: 'auto', one name,
 * or 'webgpu,wasm' (a list: the first that runs here is used and reported). An Error naming
 * the choices for anything else.
 */
export function backendPreference(backend, known) {
  const names = typeof backend === 'string' ? backend.split(',').map((b) => b.trim()).filter(Boolean) : [];
  if (!names.length || names.some((b) => b !== 'auto' && !known.includes(b))) {
    throw new Error(`backend must be 'auto', one of ${show(known)} or a comma-separated order of ` +
      `preference of them, got ${show(backend)}`);
  }
  return names;
}

/**
 * An ONNX Runtime session of `model` on the backend the platform chose (`chosen`; `backend`:
 * what was asked): a WebGPU session that cannot be created falls back to WebAssembly, said
 * in `fallback`, unless WebGPU was asked for by name; any other failure is a BundleError
 * naming `where`. Returns { session, provider (what runs it), fallback (why not the GPU, or
 * null) }. ViT.load and NaFlex.load share it.
 */
export async function createSession(ort, model, sessionOptions, { chosen, backend, noGpuReason, where }) {
  try {
    const session = await ort.InferenceSession.create(model, sessionOptions);
    return { session, provider: chosen, fallback: chosen === 'webgpu' ? null : noGpuReason ?? null };
  } catch (e) {
    if (chosen !== 'webgpu' || backend === 'webgpu') throw new BundleError(`${where}: ONNX Runtime could not create a session (${e.message})`);
    const session = await ort.InferenceSession.create(model, { ...sessionOptions, executionProviders: ['wasm'] });
    return { session, provider: 'wasm', fallback: `WebGPU session failed (${e.message}); running on WebAssembly` };
  }
}

/**
 * What every loader (ViT.load, NaFlex.load) checks before anything is read: the platform
 * bound to its class (`cls`), threads, precision and allowLarge. Returns { platform,
 * precision ('fp32'), backend ('auto'), allowLarge (false) }.
 */
export function loaderOptions(cls, options) {
  const { platform } = cls;
  if (!platform) throw new Error(`${cls.name} has no platform: import it from vit-deploy.mjs, node.mjs or browser.mjs`);
  const { precision = 'fp32', backend = 'auto', allowLarge = false } = options;
  if (options.threads != null) checkThreads(options.threads);
  if (typeof precision !== 'string') throw new Error(`precision must be a string, got ${show(precision)}`);
  if (typeof allowLarge !== 'boolean') throw new Error(`allowLarge must be true or false, got ${show(allowLarge)}`);
  return { platform, precision, backend, allowLarge };
}
