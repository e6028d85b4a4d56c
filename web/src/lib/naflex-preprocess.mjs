// SigLIP 2 NaFlex preprocessing in JavaScript: vit_deploy/runtime/naflex/'s contract and
// NaFlexPreprocess, the same floats as transformers' Siglip2ImageProcessor(Pil). Each image
// keeps its aspect ratio: it is resized (Pillow's bilinear, antialiased on downscale:
// resample.mjs, as the NCHW path) to the largest patch grid (gh, gw) of at most
// maxNumPatches patches, flattened (row, column, channel) in raster order and padded with
// zeros to maxNumPatches; a mask marks the real patches: any aspect ratios share one batch.
// Shapes in comments: B batch, N maxNumPatches, P patch, C channels (3), D width.
import { isInt, show } from './common.mjs';
import { checkNormalization } from './manifest.mjs';
import { toRGB } from './preprocess.mjs';
import { resize } from './resample.mjs';

// The graph's contract (runtime/naflex/preprocess.py): transformers' input names.
export const PIXEL_VALUES = 'pixel_values'; // (B, N, C*P*P) float32, normalised patches
export const ATTENTION_MASK = 'pixel_attention_mask'; // (B, N) int32: 1 real, 0 padding
export const SPATIAL_SHAPES = 'spatial_shapes'; // (B, 2) int64: each image's (gh, gw)
export const NAFLEX_INPUTS = [PIXEL_VALUES, ATTENTION_MASK, SPATIAL_SHAPES];
export const POOLED = 'pooled'; // (B, D) float32: the attention-pooled embedding
export const LAST_HIDDEN = 'last_hidden_state'; // (B, N, D): padding rows meaningless
export const NAFLEX_OUTPUTS = [POOLED, LAST_HIDDEN];
export const MAX_NUM_PATCHES = 256; // Siglip2ImageProcessor's default
export const PATCH_BUDGET_LIMIT = 65_536; // of maxNumPatches: 200 MB of float32 per image at patch 16
export const MAX_PATCH = 1024;
const SEARCH_EPS = 1e-5; // transformers' get_image_size_for_max_num_patches: binary-search step

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
