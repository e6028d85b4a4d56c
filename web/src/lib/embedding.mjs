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
