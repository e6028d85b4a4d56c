// Preprocessing: vit_deploy/runtime/preprocess.py in JavaScript. Decoded pixels -> RGB
// (alpha on white, Pillow's formula) -> resize rule (Pillow's resampler, resample.mjs) ->
// float32 (pixel * scale - mean) / std, NCHW: the same tensor as Python, bit for bit.
import {
  ImageError, INTERPOLATIONS, isInt, MAX_PIXELS, MAX_SIDE, MIN_CROP_PCT, RESIZE_RULES, show,
} from './common.mjs';
import { checkNormalization } from './manifest.mjs';
import { crop, resize } from './resample.mjs';

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
 * resolution [H, W], patchSize, mean, std, resize, interpolation, scale, cropPct).
 */
export class Preprocess {
  constructor({ resolution, patchSize, mean, std, resize = 'shorter_side_center_crop',
    interpolation = 'bicubic', scale = 1 / 255, cropPct = null }) {
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
    if (cropPct != null && !(typeof cropPct === 'number' && cropPct >= MIN_CROP_PCT && cropPct <= 1)) {
      throw new Error(`cropPct must be null or a number from ${MIN_CROP_PCT} to 1, got ${show(cropPct)}`);
    }
    if (cropPct != null && resize === 'patch_multiple') {
      throw new Error(`cropPct must be null under the 'patch_multiple' rule (it never crops), got ${show(cropPct)}`);
    }
    checkNormalization(mean, std, { scale });
    if (mean.length !== 3) throw new Error(`mean and std must hold 3 values (RGB), got ${mean.length}`);
    Object.assign(this, { resolution: [r[0], r[1]], patchSize, mean: [...mean], std: [...std],
      resize, interpolation, scale, cropPct: cropPct ?? null });
    Object.freeze(this);
  }

  /** The manifest's preprocessing; `overrides` replaces fields (undefined ones are ignored). */
  static fromManifest(manifest, overrides = {}) {
    const given = Object.fromEntries(Object.entries(overrides).filter(([, v]) => v != null));
    const fields = { ...manifest.preprocess, ...given };
    if (fields.resize === 'patch_multiple') fields.cropPct = null; // a rule given as an override
    return new Preprocess(fields);
  }

  /** [H, W] the image will have after resizing (and cropping). */
  targetSize(width, height) {
    if (this.resize !== 'patch_multiple') return [...this.resolution]; // cropped or squashed
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
    const [rh, rw] = resizedSize(this.resize, this.cropPct, [th, tw], width, height);
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
    if (rh !== th || rw !== tw) { // resized to cover the target: centre crop (floor offsets)
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

/**
 * [H, W] a width x height image is resized to before the centre crop to `target`: Python's
 * resized_size (runtime/preprocess.py), the same arithmetic (IEEE doubles, floor, trunc and
 * Python's round).
 */
export function resizedSize(rule, cropPct, [th, tw], width, height) {
  if (rule === 'patch_multiple') return [th, tw];
  const [sh, sw] = cropPct != null ? [Math.floor(th / cropPct), Math.floor(tw / cropPct)] : [th, tw];
  if (rule === 'squash') return [Math.max(th, sh), Math.max(tw, sw)];
  if (cropPct == null) {
    const s = Math.max(th / height, tw / width);
    return [Math.max(th, pyRound(height * s)), Math.max(tw, pyRound(width * s))];
  }
  let rh; let rw;
  if (sh === sw) {
    if (width <= height) [rh, rw] = [Math.trunc(sw * height / width), sw];
    else [rh, rw] = [sh, Math.trunc(sh * width / height)];
  } else {
    const ratio = Math.min(height / sh, width / sw);
    [rh, rw] = [pyRound(height / ratio), pyRound(width / ratio)];
  }
  return [Math.max(th, rh), Math.max(tw, rw)];
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
