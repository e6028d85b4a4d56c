// What a model's outputs become: probabilities, the top k, and the check that an output is a
// result at all (as the Python runtime's).
import { checkTopK, OutputError, show } from './common.mjs';

/** Softmax in float64, as the Python runtime's. */
export function softmax(logits) {
  let max = -Infinity;
  for (const v of logits) max = Math.max(max, v);
  const out = new Float64Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) { out[i] = Math.exp(logits[i] - max); sum += out[i]; }
  for (let i = 0; i < out.length; i++) out[i] /= sum;
  return out;
}

/** Each logit's sigmoid in float64 (SigLIP's zero-shot head: each label on its own), as Python's. */
export function sigmoid(logits) {
  return Float64Array.from(logits, (v) => 0.5 * (1 + Math.tanh(0.5 * v)));
}

/** Logits read as the purpose says: 'softmax' over the classes, or 'sigmoid' of each. */
export function probabilities(logits, rule = 'softmax') {
  if (rule === 'sigmoid') return sigmoid(logits);
  if (rule !== 'softmax') throw new Error(`probabilities must be softmax or sigmoid, got ${show(rule)}`);
  return softmax(logits);
}

/** The k most probable classes, ties by index: [{ index, label, probability }]. */
export function topK(logits, k, labels = null, rule = 'softmax') {
  checkTopK(k);
  const p = probabilities(logits, rule);
  const order = Array.from(p.keys()).sort((a, b) => p[b] - p[a] || a - b);
  return order.slice(0, Math.min(k, p.length)).map((index) => (
    { index, label: labels ? labels[index] : null, probability: p[index] }));
}

/** `values`, or an OutputError when the model produced NaN or ±Inf there (as Python's). */
export function requireFinite(values, name) {
  let bad = 0;
  for (const v of values) if (!Number.isFinite(v)) bad++;
  if (bad) {
    throw new OutputError(`the model's output ${show(name)} holds ${bad} NaN/Inf value(s) of ` +
      `${values.length}: no usable result (a broken model, or preprocessing values that overflow it)`);
  }
  return values;
}

/** The message for labels that do not match the classes an output has. */
export const labelsMismatch = (labels, width, output, where) => `the manifest has ${labels} labels, but ` +
  `the model's output ${show(output)} in ${where} has ${width} classes; expected one label per class`;
