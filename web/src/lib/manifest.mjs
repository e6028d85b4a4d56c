// The manifest, read and checked as vit_deploy/runtime/manifest.py does (the parts this
// runtime uses), the one way from a name the bundle gives to a URL, and int8 versus the CPU
// (runtime/cpu.py in JavaScript).
import {
  BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, BundleError, INT8_CPUS, INTERPOLATIONS, isInt, isReal,
  LOGITS, MAX_ABS_MEAN, MAX_SCALE, MAX_SIDE, MAX_STD, MIN_CROP_PCT, MIN_SCALE, MIN_STD, RESIZE_RULES,
  show,
  X86_INT8_EXACT,
} from './common.mjs';
import { GENERATOR } from './check.mjs';
import { readPurpose } from './purpose.mjs';

const REFERENCES_ROLE = 'references'; // the role of references.bin under files

function need(ok, where, field, expected, got) {
  if (!ok) throw new BundleError(`${where}: ${field} must be ${expected}, got ${show(got)}`);
}

/**
 * An Error (what + field, expected, given) unless mean and std are `channels` (default: as
 * many as each other) finite numbers within the bounds above, and `scale` (if given) too.
 * The one check for the manifest and for Preprocess (options a caller passes included).
 */
export function checkNormalization(mean, std, { channels = null, scale, what = '' } = {}) {
  if (channels === null && Array.isArray(mean) && Array.isArray(std) && mean.length !== std.length) {
    throw new Error(`${what}mean and ${what}std must have as many values (one per channel), ` +
      `got ${mean.length} and ${std.length}`);
  }
  let n = channels;
  for (const [name, values, low, high] of [['mean', mean, -MAX_ABS_MEAN, MAX_ABS_MEAN],
    ['std', std, MIN_STD, MAX_STD]]) {
    if (!(Array.isArray(values) && values.length > 0 && (n === null || values.length === n) &&
      values.every((v) => isReal(v) && v >= low && v <= high))) {
      throw new Error(`${what}${name} must be ${n === null ? '' : `${n} `}finite numbers from ` +
        `${low} to ${high}, got ${show(values)}`);
    }
    n = values.length;
  }
  if (scale !== undefined && !(isReal(scale) && scale >= MIN_SCALE && scale <= MAX_SCALE)) {
    throw new Error(`${what}scale must be a finite number from ${MIN_SCALE} to ${MAX_SCALE}, ` +
      `got ${show(scale)}`);
  }
}

/** A file name a bundle gives (manifest, web.json): a relative path inside it, as Python's
 * bundle_path; no absolute path or URL, no '..', no backslash, NUL, '?' or '#'. */
function safeName(name) {
  return typeof name === 'string' && name.length > 0 && name.length <= 4096 &&
    !/[\\\0?#]/.test(name) && !name.startsWith('/') && !/^[a-z][a-z0-9+.-]*:/i.test(name) &&
    !name.split('/').some((part) => part === '..' || /^(\.|%2e){2}$/i.test(part));
}

/**
 * The one way from a file name the bundle gives to a URL: refused (BundleError) unless it is
 * a relative path that stays under `base` (same origin, same directory). The platform's
 * `insideBundle(base, url, what, name)` checks what only it can see (in Node, for file:
 * URLs, that the real path, symlinks resolved, stays inside the bundle's real path too).
 */
export async function bundleFile(base, name, what = 'file', insideBundle = null) {
  if (!safeName(name)) {
    throw new BundleError(`${what} ${show(name)}: expected a relative path inside the bundle ` +
      `(no absolute path or URL, no '..')`);
  }
  const url = new URL(name, base);
  if (url.origin !== base.origin || !url.href.startsWith(base.href)) {
    throw new BundleError(`${what} ${show(name)} resolves to ${url.href}, outside the bundle ${base.href}; refused`);
  }
  await insideBundle?.(base, url, what, name);
  return url;
}

/**
 * The parts of a manifest (format v1 or v2, as runtime/manifest.py writes it) this runtime
 * reads, checked: preprocessing, input and output names, models, labels.
 */
export function readManifest(m, where = 'manifest') {
  need(m !== null && typeof m === 'object' && !Array.isArray(m), where, 'the manifest',
    'a JSON object', m);
  need(m.format === BUNDLE_FORMAT && isInt(m.format_version, 1) &&
    m.format_version <= BUNDLE_FORMAT_VERSION, where, 'format',
    `${show(BUNDLE_FORMAT)} up to v${BUNDLE_FORMAT_VERSION}`, `${m.format} v${m.format_version}`);
  const config = readConfig(m.config, where);
  const io = m.io ?? {};
  const P = io.patch_size;
  need(isInt(P, 1), where, 'io.patch_size', 'a positive integer', P);
  // the model is what the config describes (Python's manifest_parts._io)
  need(P === config.patchSize, where, 'io.patch_size', `the config's patch size ${config.patchSize}`, P);
  need(Array.isArray(io.inputs) && io.inputs.length > 0 && typeof io.inputs[0]?.name === 'string',
    where, 'io.inputs', 'a non-empty list of {name, shape, dtype}', io.inputs);
  need(Array.isArray(io.outputs) && io.outputs.length > 0 &&
    io.outputs.every((o) => typeof o?.name === 'string'), where, 'io.outputs',
  'a non-empty list of {name, shape, dtype}', io.outputs);
  const pre = m.preprocess ?? {};
  const res = pre.resolution;
  need(Array.isArray(res) && res.length === 2 && res.every((v) => isInt(v, P) && v % P === 0 &&
    v <= MAX_SIDE), where, 'preprocess.resolution',
  `[height, width], multiples of the patch size ${P} up to ${MAX_SIDE}`, res);
  const resize = pre.resize ?? 'shorter_side_center_crop';
  const interpolation = pre.interpolation ?? 'bicubic';
  const scale = pre.scale === undefined ? 1 / 255 : pre.scale;
  try { // the bounds every source of these numbers meets (as Python's manifest)
    checkNormalization(pre.mean, pre.std, { channels: 3, scale, what: 'preprocess.' });
  } catch (e) {
    throw new BundleError(`${where}: ${e.message}`);
  }
  need(RESIZE_RULES.includes(resize), where, 'preprocess.resize', `one of ${show(RESIZE_RULES)}`,
    resize);
  need(INTERPOLATIONS.includes(interpolation), where, 'preprocess.interpolation',
    `one of ${show(INTERPOLATIONS)}`, interpolation);
  const cropPct = pre.crop_pct ?? null;
  need(cropPct === null || (typeof cropPct === 'number' && cropPct >= MIN_CROP_PCT &&
    cropPct <= 1), where, 'preprocess.crop_pct', `null or a number from ${MIN_CROP_PCT} to 1`,
  cropPct);
  need(cropPct === null || resize !== 'patch_multiple', where, 'preprocess.crop_pct',
    "null under the 'patch_multiple' rule (it never crops)", cropPct);
  const models = m.models ?? {};
  need(typeof models === 'object' && typeof models.fp32 === 'string', where, 'models',
    'an object with an fp32 model', models);
  const files = m.files ?? {};
  for (const [precision, file] of Object.entries(models)) {
    need(safeName(file) && Object.hasOwn(files, file), where, `models[${show(precision)}]`,
      'a relative path inside the bundle listed under files', file);
  }
  // one label per class: the logits' last dimension (the classes of the config without it)
  const logits = io.outputs.find((o) => o.name === LOGITS);
  const classes = logits ? logits.shape?.at(-1) : (m.config?.num_classes || null);
  need(m.labels == null || (Array.isArray(m.labels) && m.labels.length === classes &&
    m.labels.every((x) => typeof x === 'string')), where, 'labels',
  classes ? `null or ${classes} strings (one per output of the model)`
    : 'null (the model has no classifier)', m.labels);
  return {
    name: m.config.name || 'ViT',
    config,
    references: readReferences(m, io, P, files, where),
    patchSize: P,
    dynamic: io.dynamic !== false,
    input: io.inputs[0].name,
    outputs: io.outputs.map((o) => o.name),
    purpose: readPurpose(m.purpose, io.outputs, where),
    models: { ...models },
    int8Cpu: Object.fromEntries(Object.keys(models).map((p) => [p, int8Cpu(m, p)])),
    labels: m.labels ?? null,
    preprocess: {
      resolution: [res[0], res[1]], patchSize: P, mean: [...pre.mean], std: [...pre.std],
      resize, interpolation, scale, cropPct,
    },
  };
}

/**
 * The model the manifest's config describes, as far as this runtime uses it: the patch size
 * and input channels (checked against the model file's own metadata by ViT.load) and what
 * the attention-memory estimate needs (heads, width, prefix tokens). Checked as
 * Python's ViTConfig (runtime/config.py): the same defaults for absent fields, the same
 * rules for the ones read.
 */
function readConfig(c, where) {
  need(c !== null && typeof c === 'object' && !Array.isArray(c), where, 'config', 'an object', c);
  const int = (v) => isInt(v) && v < 2 ** 31;
  const field = (key, fallback, ok, expected) => {
    const v = Object.hasOwn(c, key) ? c[key] : fallback;
    need(ok(v), where, `config.${key}`, expected, v);
    return v;
  };
  const patchSize = field('patch_size', 16, (v) => int(v) && v >= 1, 'an integer >= 1');
  const heads = field('heads', 12, (v) => int(v) && v >= 1, 'an integer >= 1');
  const width = field('width', 768, (v) => int(v) && v >= 1 && v % heads === 0,
    `an integer >= 1 divisible by heads ${heads}`);
  const bool = (v) => typeof v === 'boolean';
  const classToken = field('class_token', true, bool, 'true or false');
  const distToken = field('dist_token', false, bool, 'true or false');
  const registers = field('num_registers', 0, int, 'an integer >= 0');
  field('img_size', [224, 224], (v) => Array.isArray(v) && v.length === 2 &&
    v.every((s) => int(s) && s >= 1 && s % patchSize === 0), `[height, width], positive ` +
    `multiples of patch_size ${patchSize}`);
  const inChans = field('in_chans', 3, (v) => int(v) && v >= 1, 'an integer >= 1');
  field('name', '', (v) => typeof v === 'string', 'a string');
  return { patchSize, inChans, heads, width,
    prefixTokens: Number(classToken) + Number(distToken) + registers };
}

// -- golden references ----------------------------------------------------------------------
/**
 * The manifest's `references` (absent in bundles exported before them: null), checked: the
 * file listed under files with role "references", a generator this runtime knows, cases of
 * [batch, 3, H, W] inputs (patch multiples) whose float32 outputs lie inside the file.
 */
function readReferences(m, io, P, files, where) {
  const r = m.references;
  if (r === undefined || r === null) return null;
  const at = `${where}: references`;
  need(typeof r === 'object' && !Array.isArray(r), at, 'the record', 'an object', r);
  need(safeName(r.file) && files[r.file]?.role === REFERENCES_ROLE && isInt(files[r.file]?.size),
    at, 'file', `a file listed under files with role ${show(REFERENCES_ROLE)}`, r.file);
  need(r.generator === GENERATOR, at, 'generator', show(GENERATOR), r.generator);
  need(typeof r.source === 'string', at, 'source', 'a string', r.source);
  need(Array.isArray(r.cases) && r.cases.length > 0, at, 'cases', 'a non-empty list', r.cases);
  const size = files[r.file].size;
  const declared = io.outputs.map((o) => o.name);
  const cases = r.cases.map((c, k) => {
    const here = `${at}.cases[${k}]`;
    need(c !== null && typeof c === 'object' && typeof c.name === 'string', here, 'name', 'a string', c?.name);
    need(isInt(c.seed) && c.seed <= 0xffffffff, here, 'seed', 'an integer from 0 to 2^32-1', c.seed);
    const s = c.shape;
    need(Array.isArray(s) && s.length === 4 && isInt(s[0], 1) && s[1] === 3 &&
      s.slice(2).every((v) => isInt(v, P) && v % P === 0 && v <= MAX_SIDE) &&
      s[0] * 3 * s[2] * s[3] <= MAX_SIDE * MAX_SIDE, here, 'shape',
    `[batch, 3, H, W] with H and W multiples of the patch size ${P}`, s);
    need(c.outputs !== null && typeof c.outputs === 'object' && Object.keys(c.outputs).length > 0,
      here, 'outputs', 'an object of {offset, shape}', c.outputs);
    const outputs = {};
    for (const [name, o] of Object.entries(c.outputs)) {
      need(declared.includes(name), here, `outputs[${show(name)}]`, `one of io.outputs ${show(declared)}`, name);
      const n = Array.isArray(o?.shape) && o.shape.every((v) => isInt(v, 1))
        ? o.shape.reduce((a, b) => a * b, 1) : NaN;
      need(n > 0 && o.shape[0] === s[0] && isInt(o.offset) && o.offset % 4 === 0 &&
        o.offset + 4 * n <= size, here, `outputs[${show(name)}]`,
      `{offset (bytes, a multiple of 4), shape [${s[0]}, ...]} inside the ${size}-byte ${r.file}`, o);
      outputs[name] = { offset: o.offset, shape: [...o.shape] };
    }
    let pixels = null;
    if (c.pixels !== undefined && c.pixels !== null) {
      const px = c.pixels;
      const nums = (v) => Array.isArray(v) && v.length === s[1] && v.every(Number.isFinite);
      need(px !== null && typeof px === 'object' && isInt(px.offset) &&
        px.offset + s[0] * s[1] * s[2] * s[3] <= size && nums(px.mean) && nums(px.std) &&
        px.std.every((v) => v !== 0) && Number.isFinite(px.scale), here, 'pixels',
      `{offset: uint8 [${s}] inside the ${size}-byte ${r.file}, mean and std: ${s[1]} numbers (std non-zero), scale}`, px);
      pixels = { offset: px.offset, mean: [...px.mean], std: [...px.std], scale: px.scale };
    }
    return { name: c.name, seed: c.seed, shape: [...s], outputs, pixels };
  });
  return { file: r.file, generator: r.generator, source: r.source, size,
    sha256: files[r.file].sha256 ?? null, cases };
}

// -- int8 and the CPU: runtime/cpu.py in JavaScript ---------------------------------------
const INT8_KINDS = ['dynamic', 'static QDQ'];
const CALIBRATION_METHODS = ['minmax', 'entropy', 'percentile'];
const names = (x) => (Array.isArray(x) ? x.filter((s) => typeof s === 'string') : []);

/**
 * The typed int8 recipe of a precision, or null when it is not int8: the fields and rules of
 * Python's Int8Recipe.read (vit_deploy/runtime/recipe.py; both tested on one table,
 * tests/data/int8-recipes.json). An unknown value reads as not stated (null); `needs` (the
 * CPUs the file is exact on) then assumes 8-bit weights, `newGraphCpu` portable ones.
 */
export function int8Recipe(m, precision) {
  const r = m.precisions?.[precision]?.recipe;
  if (r === null || typeof r !== 'object' || Array.isArray(r) || !INT8_KINDS.includes(r.kind)) {
    return null;
  }
  let cpu = INT8_CPUS.includes(r.cpu) ? r.cpu : null;
  if (r.cpu == null && r.reduce_range === true) cpu = 'any'; // older files said only that
  const alpha = r.smoothing !== null && typeof r.smoothing === 'object' ? r.smoothing.alpha : null;
  const pct = r.percentile;
  return {
    kind: r.kind,
    cpu,
    calibration: CALIBRATION_METHODS.includes(r.calibration) ? r.calibration : null,
    percentile: isReal(pct) && pct > 0 && pct <= 100 ? pct : null,
    smoothing: isReal(alpha) && alpha >= 0 && alpha <= 1 ? alpha : null,
    quantisedLayers: names(r.quantised_layers),
    keptFloatLayers: names(r.kept_float_layers),
    needs: cpu ?? 'vnni',
    newGraphCpu: cpu === 'vnni' ? 'vnni' : 'any',
  };
}

/** The CPUs a precision's int8 file is exact on ('any', 'vnni'), or null when it is not
 * int8: as Python's Manifest.int8_cpu. */
export function int8Cpu(m, precision) {
  return int8Recipe(m, precision)?.needs ?? null;
}

/** Whether an x86 CPU with these /proc/cpuinfo flags runs 8-bit int8 weights exactly. */
export function exactInt8(arch, flags) {
  if (arch === 'arm64') return true;
  if (arch !== 'x64' || flags == null) return null;
  return X86_INT8_EXACT.some((f) => flags.includes(f)) || !flags.includes('avx2');
}

/**
 * A warning for running an int8 file that needs `need` here (onnxruntime-node's CPU kernels
 * are Python's); null when exact or not int8. WebAssembly's kernels widen to 32 bits before
 * they add. `facts` ({ node, arch, flags }) override what the platform's `host` says
 * ({ node, arch, cpuFlags: async () => flags or null }); flags are read only when needed.
 * `fromFile` (async () => 'vnni', 'any' or null: onnx-metadata's int8WeightsNeed), called
 * only on a CPU that could saturate: the file's own weights decide over the recipe's claim,
 * as Python's ViTSession.
 */
export async function int8Warning(need, facts = {}, host = {}, fromFile = null) {
  const node = facts.node ?? host.node ?? false;
  if (need == null || !node) return null;
  const arch = facts.arch ?? host.arch;
  const flags = facts.flags === undefined ? (await host.cpuFlags?.()) ?? null : facts.flags;
  const ok = exactInt8(arch, flags);
  if (ok) return null;
  if (fromFile) need = (await fromFile()) ?? need;
  if (need !== 'vnni') return null;
  return ok === false
    ? 'this int8 file has 8-bit weights, which this CPU (x86 with AVX2, no VNNI / AMX) ' +
      'saturates: expect wrong outputs (re-quantise with --int8-cpu any)'
    : 'this int8 file has 8-bit weights, exact on x86 with VNNI / AMX or ARM64; cannot tell ' +
      'whether this CPU has them';
}
