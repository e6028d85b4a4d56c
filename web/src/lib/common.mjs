// What every module shares: the bundle contract's constants (each one Python's, as
// tests/test_web_constants.py checks), the errors, and the small checks they are built on.

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

/** A value as an error message quotes it: JSON, at most 60 characters. */
export const show = (v) => { const s = JSON.stringify(v); return s === undefined ? String(v) : s.slice(0, 60); };
export const isInt = (v, low = 0) => Number.isInteger(v) && v >= low;
export const isReal = (v) => typeof v === 'number' && Number.isFinite(v);
