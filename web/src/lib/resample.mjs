// Pillow's Image.resize on RGB bytes, written out: the same bytes as Python's, in Node and in
// the browser alike (a canvas `drawImage` filter is unspecified, so no canvas resizes).
import { INTERPOLATIONS, show } from './common.mjs';

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

// Which pass Pillow runs first. Found by experiment against the Pillow 13.0.0 this project
// pins (tests/test_resample_order.py holds it to this on a grid of sizes, for every filter):
// the vertical pass first when the height shrinks by more than twice what the width
// shrinks by (in pixels; a width that grows or stays counts as 0), else the horizontal
// pass first (as every Pillow before 13 did). Either way the intermediate image is 8-bit,
// rounded and clipped as below, so the order changes the bytes (by up to ~9 levels).
export const verticalFirst = (inW, inH, outW, outH) => inH - outH > Math.max(0, 2 * (inW - outW));

const HALF = 1 << (PRECISION_BITS - 1);

// One horizontal pass: `rows` rows of `src` (width inW) from row `rowOffset` -> outW wide.
function horizontalPass(src, inW, rows, rowOffset, outW, { ksize, bounds, kk }) {
  const out = new Uint8Array(outW * rows * 3);
  for (let y = 0; y < rows; y++) {
    const row = (y + rowOffset) * inW * 3;
    for (let xx = 0; xx < outW; xx++) {
      const xmin = bounds[xx * 2];
      const xmax = bounds[xx * 2 + 1];
      let s0 = HALF; let s1 = HALF; let s2 = HALF;
      for (let x = 0; x < xmax; x++) {
        const w = kk[xx * ksize + x];
        const p = row + (x + xmin) * 3;
        s0 += src[p] * w; s1 += src[p + 1] * w; s2 += src[p + 2] * w;
      }
      const o = (y * outW + xx) * 3;
      out[o] = clip8(s0); out[o + 1] = clip8(s1); out[o + 2] = clip8(s2);
    }
  }
  return out;
}

// One vertical pass: `src` (width, its first row being source row `rowOffset`) -> outH rows.
function verticalPass(src, width, rowOffset, outH, { ksize, bounds, kk }) {
  const out = new Uint8Array(width * outH * 3);
  for (let yy = 0; yy < outH; yy++) {
    const ymin = bounds[yy * 2] - rowOffset;
    const ymax = bounds[yy * 2 + 1];
    for (let xx = 0; xx < width; xx++) {
      let s0 = HALF; let s1 = HALF; let s2 = HALF;
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

/** RGB bytes, inW x inH -> outW x outH, as Pillow's Image.resize with this filter. */
export function resize(pixels, inW, inH, outW, outH, interpolation = 'bicubic') {
  if (outW === inW && outH === inH) return Uint8Array.from(pixels);
  // NEAREST is a separable selection of source pixels: no intermediate rounding, no order
  if (interpolation === 'nearest') return resizeNearest(pixels, inW, inH, outW, outH);
  const filter = FILTERS[interpolation];
  if (!filter) throw new Error(`interpolation must be one of ${show(INTERPOLATIONS)}, got ${show(interpolation)}`);
  const horiz = coefficients(inW, outW, filter);
  const vert = coefficients(inH, outH, filter);
  if (outH === inH) return horizontalPass(pixels, inW, inH, 0, outW, horiz);
  if (outW === inW) return verticalPass(pixels, inW, 0, outH, vert);
  if (verticalFirst(inW, inH, outW, outH)) {
    return horizontalPass(verticalPass(pixels, inW, 0, outH, vert), inW, outH, 0, outW, horiz);
  }
  // horizontal first, over only the source rows the vertical pass reads
  const first = vert.bounds[0];
  const last = vert.bounds[outH * 2 - 2] + vert.bounds[outH * 2 - 1];
  return verticalPass(horizontalPass(pixels, inW, last - first, first, outW, horiz), outW, first,
    outH, vert);
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

/** The w x h RGB window at (left, top) of an image `width` pixels wide. */
export function crop(pixels, width, left, top, w, h) {
  const out = new Uint8Array(w * h * 3);
  for (let y = 0; y < h; y++) {
    const from = ((top + y) * width + left) * 3;
    out.set(pixels.subarray(from, from + w * 3), y * w * 3);
  }
  return out;
}
