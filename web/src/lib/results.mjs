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

/** The k most probable classes, ties by index: [{ index, label, probability }]. */
export function topK(logits, k, labels = null) {
  checkTopK(k);
  const p = softmax(logits);
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
