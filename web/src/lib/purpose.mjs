// What a bundle is for, as Python's vit_deploy/runtime/purpose.py: it classifies (an output
// that gives logits), embeds (one vector per image: which output, its width, unit length or
// not, its similarity), or both. The manifest's `purpose`; absent (a bundle written before
// the field), read from the output names.
import { BundleError, isGridOutput, LOGITS, show } from './common.mjs';

// The outputs that are one vector per image, best first (Python's EMBEDDING_OUTPUTS)
export const EMBEDDING_OUTPUTS = ['pooled', 'class_token'];
const OUTPUT_KINDS = [LOGITS, 'pooled', 'patch_tokens', 'class_token', 'register_tokens'];
const SIMILARITIES = ['cosine', 'dot'];
// How a classifier's logits become probabilities (Python's PROBABILITIES)
const PROBABILITIES = ['softmax', 'sigmoid'];

function kind(classifier, embedding) {
  if (classifier && embedding) return 'classifier+embedding';
  return classifier ? 'classifier' : (embedding ? 'embedding' : 'features');
}

/** Purpose.of_outputs: from the outputs' names and shapes ({ name, shape }). */
export function purposeOfOutputs(outputs) {
  const names = outputs.map((o) => o.name);
  const classifier = names.includes(LOGITS) ? LOGITS
    : (names.length && !names.every((n) => OUTPUT_KINDS.includes(n) || isGridOutput(n)) ? names[0] : null);
  const embedding = EMBEDDING_OUTPUTS.find((n) => names.includes(n)) ?? null;
  const shape = outputs.find((o) => o.name === embedding)?.shape;
  const dim = Array.isArray(shape) && shape.length === 2 && Number.isInteger(shape[1]) ? shape[1] : null;
  return { kind: kind(classifier, embedding), classifier, embedding, dim, normalised: false,
    similarity: 'cosine', probabilities: 'softmax' };
}

/** parse_purpose: the manifest's `purpose` checked against its declared outputs. */
export function readPurpose(value, outputs, where) {
  if (value === undefined || value === null) return purposeOfOutputs(outputs);
  const bad = (field, expected, got) =>
    new BundleError(`${where}: purpose.${field} must be ${expected}, got ${show(got)}`);
  if (typeof value !== 'object' || Array.isArray(value)) throw bad('', 'an object', value);
  const shapes = new Map(outputs.map((o) => [o.name, Array.isArray(o.shape) ? o.shape : []]));
  const classifier = value.classifier ?? null;
  if (classifier !== null && (typeof classifier !== 'string' || !shapes.has(classifier))) {
    throw bad('classifier', `null or one of the outputs ${show([...shapes.keys()])}`, classifier);
  }
  const probabilities = value.probabilities ?? 'softmax';
  if (!PROBABILITIES.includes(probabilities) || (probabilities !== 'softmax' && classifier === null)) {
    throw bad('probabilities', `one of ${show(PROBABILITIES)} (with a classifier)`, probabilities);
  }
  const emb = value.embedding ?? null;
  if (emb === null) return { kind: kind(classifier, null), classifier, embedding: null, dim: null,
    normalised: false, similarity: 'cosine', probabilities };
  if (typeof emb !== 'object' || Array.isArray(emb)) throw bad('embedding', 'null or an object', emb);
  const name = emb.output;
  if (typeof name !== 'string' || shapes.get(name)?.length !== 2) {
    const vectors = [...shapes].filter(([, s]) => s.length === 2).map(([n]) => n);
    throw bad('embedding.output', `one of the (batch, width) outputs ${show(vectors)}`, name);
  }
  const width = shapes.get(name)[1];
  const dim = emb.dim ?? null;
  if (dim !== null && (!Number.isInteger(dim) || (Number.isInteger(width) && dim !== width))) {
    throw bad('embedding.dim', `null or the output's width ${width}`, dim);
  }
  const normalised = emb.normalised ?? false;
  if (typeof normalised !== 'boolean') throw bad('embedding.normalised', 'true or false', normalised);
  const similarity = emb.similarity ?? 'cosine';
  if (!SIMILARITIES.includes(similarity)) {
    throw bad('embedding.similarity', `one of ${show(SIMILARITIES)}`, similarity);
  }
  return { kind: kind(classifier, name), classifier, embedding: name, dim, normalised, similarity,
    probabilities };
}
