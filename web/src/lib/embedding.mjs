// Images in, vectors out: one image's embedding, as Python's ViTSession.embed
// (vit_deploy/runtime/embedding.py): the bundle's one-vector-per-image output, unit length.
import { BundleError, show } from './common.mjs';
import { purposeOfOutputs } from './purpose.mjs';
import { requireFinite } from './results.mjs';


/**
 * vit.embed(image, { normalize = true, output, ...preprocessing overrides }) ->
 * { data: Float32Array(D), dim, output, normalized, similarity: 'cosine', inputSize: [H, W],
 *   ms: { prepare, run }, provider }. Prepared as classify() prepares (the manifest's rule).
 */
export async function embedImage(vit, image, { normalize = true, output = null, ...overrides } = {}) {
  const purpose = vit.manifest?.purpose ?? purposeOfOutputs(vit.outputNames.map((n) => ({ name: n })));
  const name = output ?? purpose.embedding;
  if (!name || !vit.outputNames.includes(name)) {
    throw new BundleError(`${vit.url} has no ${name ? show(name) : 'one-vector-per-image output'} ` +
      `to embed with (outputs: ${show(vit.outputNames)}); export with --outputs pooled`);
  }
  const t0 = performance.now();
  const { data, dims } = await vit.pixels(image, overrides);
  const t1 = performance.now();
  const out = (await vit.runAll(data, dims, [name]))[name];
  const t2 = performance.now();
  requireFinite(out.data, name);
  if (out.dims.length !== 2) {
    throw new BundleError(`${vit.url}: output ${show(name)} has dims ${show(out.dims)}; an embedding is [batch, width]`);
  }
  const vector = Float32Array.from(out.data);
  if (normalize) {
    let sum = 0;
    for (const x of vector) sum += x * x;
    const norm = Math.max(Math.sqrt(sum), 1e-12);
    for (let i = 0; i < vector.length; i++) vector[i] /= norm;
  }
  return { data: vector, dim: vector.length, output: name, normalized: normalize, similarity: purpose.similarity,
    inputSize: [dims[2], dims[3]], ms: { prepare: t1 - t0, run: t2 - t1 }, provider: vit.info.provider };
}

/**
 * Each row's `k` nearest other rows by the dot product (of unit vectors: cosine), nearest
 * first, ties in row order: [[{ index, similarity }]], one list per row (as numpy's
 * argsort(-scores, kind="stable") ranks them, the row itself left out).
 */
export function nearestNeighbours(rows, k) {
  if (!Number.isInteger(k) || k < 1) throw new RangeError(`k must be a positive integer, got ${show(k)}`);
  const dot = (a, b) => { let s = 0; for (let i = 0; i < a.length; i++) s += a[i] * b[i]; return s; };
  return rows.map((row, i) => rows.map((other, j) => ({ index: j, similarity: dot(row, other) }))
    .filter((n) => n.index !== i)
    .sort((a, b) => b.similarity - a.similarity || a.index - b.index)
    .slice(0, k));
}

/** Rows of one width as a NumPy .npy file (format 1.0: little-endian float32, C order). */
export function npyBytes(rows) {
  const n = rows.length;
  const d = n ? rows[0].length : 0;
  if (rows.some((r) => r.length !== d)) throw new RangeError('npyBytes: rows of different widths');
  let header = `{'descr': '<f4', 'fortran_order': False, 'shape': (${n}, ${d}), }`;
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n'; // magic + header: 64-byte aligned
  const out = new Uint8Array(10 + header.length + 4 * n * d);
  out.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0, header.length & 0xff, header.length >> 8]);
  for (let i = 0; i < header.length; i++) out[10 + i] = header.charCodeAt(i);
  const view = new DataView(out.buffer, 10 + header.length);
  rows.forEach((r, i) => r.forEach((x, j) => view.setFloat32(4 * (i * d + j), x, true)));
  return out;
}
