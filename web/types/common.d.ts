// What every entry declares alike (src/lib/api.mjs's names, and the shapes ViT works with).
// Each entry's declarations (node.d.ts, browser.d.ts, vit-deploy.d.ts) re-export these and
// declare ViT, decodeImage, bundleFile and int8Warning for its own platform's images.

// -- the bundle contract (src/lib/common.mjs; Python's, as tests/website/test_web_constants.py checks)
export declare const BUNDLE_FORMAT: 'vit-deploy-bundle';
/** The newest manifest format this runtime reads. */
export declare const BUNDLE_FORMAT_VERSION: number;
export type ResizeRule = 'shorter_side_center_crop' | 'patch_multiple' | 'squash';
export type Interpolation = 'bicubic' | 'bilinear' | 'nearest' | 'lanczos';
export declare const RESIZE_RULES: ResizeRule[];
export declare const INTERPOLATIONS: Interpolation[];
/** Pillow's decompression-bomb bound, as in Python. */
export declare const MAX_PIXELS: number;
/** The longest side a resize rule may give the model input. */
export declare const MAX_SIDE: number;
/** The smallest crop_pct (resize to side / crop_pct first: at most 10x the crop). */
export declare const MIN_CROP_PCT: number;
/** What `vit-deploy web` adds beside the manifest. */
export declare const WEB_RECORD: 'web.json';
export declare const LOGITS: 'logits';
export declare const PATCH_TOKENS: 'patch_tokens';
export declare const MAX_ABS_MEAN: number;
export declare const MIN_STD: number;
export declare const MAX_STD: number;
export declare const MIN_SCALE: number;
export declare const MAX_SCALE: number;
/** x86 CPU flags whose int8 kernels are exact with 8-bit weights. */
export declare const X86_INT8_EXACT: string[];
/** The CPUs an int8 file may declare it is exact on. */
export type Int8Cpu = 'any' | 'vnni';
export declare const INT8_CPUS: Int8Cpu[];
/** Outputs laid out on the patch grid, [batch, width, gh, gw]: patch_tokens and layer_N. */
export declare function isGridOutput(name: string): boolean;

// -- errors ---------------------------------------------------------------------------------
/** A bundle that cannot be used: says which file and why. */
export declare class BundleError extends Error {
  constructor(message: string);
  name: 'BundleError';
}
/** An input that is not a usable image: says which one and why. */
export declare class ImageError extends Error {
  constructor(message: string);
  name: 'ImageError';
}
/** A model output that is no result (NaN or ±Inf): says which output and how many. */
export declare class OutputError extends Error {
  constructor(message: string);
  name: 'OutputError';
}

// -- pixels and preprocessing ----------------------------------------------------------------
/** Decoded pixels, RGBA (as ImageData) or RGB, row-major. */
export interface Pixels {
  data: Uint8Array | Uint8ClampedArray;
  width: number;
  height: number;
  /** 4 (RGBA) or 3 (RGB); default: what data's length says. */
  channels?: 3 | 4;
}
/** RGB pixels, 3 bytes a pixel. */
export interface RGB {
  data: Uint8Array;
  width: number;
  height: number;
}
/** A model input: float32 NCHW values and their dims [1, 3, H, W]. */
export interface Tensor4 {
  data: Float32Array;
  dims: number[];
}

/** How pixels become model input (the fields of Python's `Preprocess`). */
export interface PreprocessFields {
  resolution: [number, number];
  patchSize: number;
  mean: number[];
  std: number[];
  resize: ResizeRule;
  interpolation: Interpolation;
  scale: number;
  /** timm's crop_pct: resize to floor(side / cropPct), then centre-crop; null: just cover. */
  cropPct: number | null;
}
/** What a caller may replace of the manifest's preprocessing (undefined / null: kept). */
export interface PreprocessOverrides {
  resolution?: number | [number, number] | null;
  patchSize?: number | null;
  mean?: number[] | null;
  std?: number[] | null;
  resize?: ResizeRule | null;
  interpolation?: Interpolation | null;
  scale?: number | null;
  cropPct?: number | null;
}

/** vit_deploy/runtime/preprocess.py in JavaScript: the same tensor as Python, bit for bit. */
export declare class Preprocess implements Readonly<PreprocessFields> {
  constructor(fields: Omit<PreprocessFields, 'resolution' | 'resize' | 'interpolation' | 'scale' |
    'cropPct'> & {
    resolution: number | [number, number];
    resize?: ResizeRule;
    interpolation?: Interpolation;
    scale?: number;
    cropPct?: number | null;
  });
  readonly resolution: [number, number];
  readonly patchSize: number;
  readonly mean: number[];
  readonly std: number[];
  readonly resize: ResizeRule;
  readonly interpolation: Interpolation;
  readonly scale: number;
  readonly cropPct: number | null;
  /** The manifest's preprocessing with `overrides` applied. */
  static fromManifest(manifest: Manifest, overrides?: PreprocessOverrides): Preprocess;
  /** [H, W] the image will have after resizing (and cropping). */
  targetSize(width: number, height: number): [number, number];
  /** The target size and the size resized to before the crop; an ImageError when too big. */
  plan(width: number, height: number): { target: [number, number]; resized: [number, number] };
  /** Decoded pixels -> { data: Float32Array (3, H, W), dims: [1, 3, H, W] }. */
  tensor(image: Pixels): Tensor4;
}
/** RGBA or RGB pixels -> RGB, alpha composited on white (Pillow's formula). */
export declare function toRGB(image: Pixels): RGB;
/** Python's round(): halves to even. For x >= 0. */
export declare function pyRound(x: number): number;
/** RGB bytes, inW x inH -> outW x outH, as Pillow's Image.resize with this filter. */
export declare function resize(pixels: Uint8Array, inW: number, inH: number, outW: number,
  outH: number, interpolation?: Interpolation): Uint8Array;
/** The EXIF Orientation tag (1..8) of JPEG bytes; 1 when there is none. */
export declare function exifOrientation(bytes: ArrayBufferView): number;
/** Pixels turned upright by an EXIF orientation, as Pillow's ImageOps.exif_transpose. */
export declare function orient<P extends Pixels>(image: P, orientation: number): P | Required<Pixels>;

// -- the manifest ------------------------------------------------------------------------------
/** The parts of a bundle's manifest.json the runtime reads, checked (readManifest). */
/** The model a manifest's config describes, as far as the runtime uses it: checked against
 * the model file's own metadata (patch size, input channels) and read by the
 * attention-memory guard (heads, width, prefix tokens: class, distillation, registers). */
export interface ModelConfig {
  patchSize: number;
  inChans: number;
  heads: number;
  width: number;
  prefixTokens: number;
}
export interface Manifest {
  name: string;
  config: ModelConfig;
  patchSize: number;
  dynamic: boolean;
  /** The model input's name. */
  input: string;
  /** The model outputs' names, in order. */
  outputs: string[];
  /** precision -> model file, relative to the bundle. */
  models: Record<string, string>;
  /** precision -> the CPUs its int8 file is exact on; null when not int8. */
  int8Cpu: Record<string, Int8Cpu | null>;
  labels: string[] | null;
  /** What the bundle is for: it classifies, embeds, or both (manifest `purpose`). */
  purpose: Purpose;
  preprocess: PreprocessFields;
  /** The golden references; null in bundles exported without them. */
  references: References | null;
}
/** What a bundle is for, as Python's runtime/purpose.py (absent in old manifests: from the outputs). */
export interface Purpose {
  kind: 'classifier' | 'embedding' | 'classifier+embedding' | 'features';
  /** The output that classifies; null: the bundle does not. */
  classifier: string | null;
  /** The output that embeds an image; null: none does. */
  embedding: string | null;
  /** The embedding's width where the graph fixes it. */
  dim: number | null;
  /** The output is unit length as it comes out (ours are not: embed() scales them). */
  normalised: boolean;
  similarity: 'cosine' | 'dot';
  /** How the classifier's logits become probabilities: softmax over the classes, or each
   *  class's sigmoid (a SigLIP zero-shot head: each label judged on its own). */
  probabilities: 'softmax' | 'sigmoid';
}
/** Purpose.of_outputs: what outputs so named and shaped are for. */
export declare function purposeOfOutputs(outputs: { name: string; shape?: (number | string)[] }[]): Purpose;
/** The manifest's `purpose` checked against its outputs (absent: from the outputs); BundleError if it lies. */
export declare function readPurpose(value: unknown, outputs: { name: string; shape?: (number | string)[] }[], where: string): Purpose;
/** Each row's k nearest other rows by dot product (cosine for unit rows), nearest first. */
export declare function nearestNeighbours(rows: ArrayLike<number>[], k: number): { index: number; similarity: number }[][];
/** Rows of one width as a NumPy .npy file (little-endian float32). */
export declare function npyBytes(rows: ArrayLike<number>[]): Uint8Array;
/** A manifest.json (parsed JSON) checked as Python's runtime/manifest.py; BundleError if not. */
export declare function readManifest(json: unknown, where?: string): Manifest;
/** Throws an Error unless mean, std (and scale) are usable normalisation values. */
export declare function checkNormalization(mean: unknown, std: unknown,
  options?: { channels?: number | null; scale?: unknown; what?: string }): void;
/** A precision's int8 recipe, typed as Python's Int8Recipe (vit_deploy/runtime/recipe.py). */
export interface Int8Recipe {
  kind: 'dynamic' | 'static QDQ';
  /** As stated; null where the manifest does not say or says something unknown. */
  cpu: Int8Cpu | null;
  calibration: 'minmax' | 'entropy' | 'percentile' | null;
  percentile: number | null;
  /** The SmoothQuant alpha folded into the graph; null: none. */
  smoothing: number | null;
  quantisedLayers: string[];
  keptFloatLayers: string[];
  /** The CPUs the file is exact on (an unstated CPU reads as 8-bit weights). */
  needs: Int8Cpu;
  /** The CPUs a graph quantised after this recipe must be exact on. */
  newGraphCpu: Int8Cpu;
}
/** The typed int8 recipe of a precision, or null when it is not int8 (raw manifest). */
export declare function int8Recipe(manifest: unknown, precision: string): Int8Recipe | null;
/** The CPUs a precision's int8 file is exact on, or null when it is not int8 (raw manifest). */
export declare function int8Cpu(manifest: unknown, precision: string): Int8Cpu | null;
/** Whether an x86 CPU with these /proc/cpuinfo flags runs 8-bit int8 weights exactly;
 * null when it cannot tell. */
export declare function exactInt8(arch: string, flags: string[] | null): boolean | null;
/** What int8Warning may be told instead of asking the platform. */
export interface CpuFacts {
  node?: boolean;
  arch?: string;
  flags?: string[] | null;
}

// -- results ---------------------------------------------------------------------------------
/** Softmax in float64, as the Python runtime's. */
export declare function softmax(logits: ArrayLike<number> & Iterable<number>): Float64Array;
/** Each logit's sigmoid in float64. */
export declare function sigmoid(logits: ArrayLike<number> & Iterable<number>): Float64Array;
/** Logits read as a purpose says: softmax over the classes, or each one's sigmoid. */
export declare function probabilities(logits: ArrayLike<number> & Iterable<number>,
  rule?: 'softmax' | 'sigmoid'): Float64Array;
export interface TopClass {
  index: number;
  label: string | null;
  probability: number;
}
/** The k most probable classes, ties by index (`rule`: the purpose's probabilities). */
export declare function topK(logits: ArrayLike<number> & Iterable<number>, k: number,
  labels?: string[] | null, rule?: 'softmax' | 'sigmoid'): TopClass[];
/** `values`, or an OutputError when they hold NaN or ±Inf. */
export declare function requireFinite<T extends Iterable<number> & { length: number }>(values: T,
  name: string): T;

// -- checking a bundle: golden references, the tolerance policy, the report -------------------
/** fp32 passes when max |Δ| <= FP32_ABS_TOL · max(1, max |reference|) (and cosine). */
export declare const FP32_ABS_TOL: number;
/** The least cosine to the PyTorch fp32 reference, per tolerance class. */
export declare const COSINE_MIN: Readonly<Record<'fp32' | 'fp16' | 'int8' | 'int4', number>>;
/** The tolerance class a precision is judged by (int8-static as int8). */
export declare function toleranceClass(precision: string): 'fp32' | 'fp16' | 'int8' | 'int4';
/** A reference case's input from its seed (generator "mulberry32-uniform-v1"). */
export declare function seededInput(seed: number, shape: number[]): Float32Array;
/** A real-photograph reference case's input from its stored uint8 pixels. */
export declare function pixelInput(bytes: Uint8Array,
  pixels: { offset: number; mean: number[]; std: number[]; scale: number },
  shape: number[]): Float32Array;
/** One output against its reference, by the tolerance policy (NaN / Inf: null, failed).
 * `rows`: the output is that many images' outputs, and the cosine is the least of theirs
 * (Python's parity.metrics); default 1, one cosine over the whole output. */
export declare function compare(got: ArrayLike<number>, reference: ArrayLike<number>,
  precision: Precision, options?: { rows?: number }): Pick<CheckCase, 'max_abs' | 'abs_tol' | 'cosine' | 'cosine_min' | 'passed'>;
/** Several reports of one bundle on one device (the page's backends) as one. */
export declare function mergeReports(reports: Report[]): Report;

/** The golden references a bundle carries (manifest `references`; references.bin). */
export interface References {
  file: string;
  generator: 'mulberry32-uniform-v1';
  /** What made the outputs, e.g. "pytorch fp32 (torch 2.13.0)". */
  source: string;
  /** Bytes of the file, as the manifest lists it. */
  size: number;
  sha256: string | null;
  cases: Array<{
    name: string;
    seed: number;
    /** The input's [batch, 3, H, W]. */
    shape: [number, number, number, number];
    /** Output name -> its float32 values' byte offset in the file and shape. */
    outputs: Record<string, { offset: number; shape: number[] }>;
    /** A real photograph's case: its uint8 input [batch, 3, H, W] at `offset` (the seed is
     * unused), made into the model input as (pixels · scale − mean) / std per channel. */
    pixels: { offset: number; mean: number[]; std: number[]; scale: number } | null;
  }>;
}

/** The machine a report was made on. */
export interface ReportDevice {
  /** "onnxruntime-node 1.30.0", "onnxruntime-web 1.30.0", "onnxruntime 1.31.1 (python)". */
  runtime: string;
  platform: string;
  cpu: string | null;
  /** The WebGPU adapter that ran (browser), e.g. "google swiftshader": a software one. */
  gpu: string | null;
}
/** One reference case × output on one provider and precision. */
export interface CheckCase {
  label: string;
  /** What actually ran: cpu / cuda / tensorrt / wasm / webgpu. */
  provider: string;
  precision: string;
  resolution: [number, number];
  batch: number;
  output: string;
  /** null when not finite. */
  max_abs: number | null;
  /** fp32 only: FP32_ABS_TOL · max(1, max |reference|). */
  abs_tol: number | null;
  cosine: number | null;
  cosine_min: number;
  passed: boolean;
}
export interface LatencyEntry {
  provider: string;
  precision: string;
  resolution: [number, number];
  batch: number;
  p50_ms: number;
  p90_ms: number;
  runs: number;
}
/** The report every runtime writes (Python `check --json` / `bench --json`, Node, the page). */
export interface Report {
  schema: 'vit-deploy-report';
  schema_version: 1;
  kind: 'check' | 'bench';
  bundle: string;
  device: ReportDevice;
  /** Which reference: "golden references (pytorch fp32, torch 2.13.0)", ... */
  reference: string;
  passed: boolean;
  cases: CheckCase[];
  latency: LatencyEntry[];
}
/** What `vit.check()` returns. */
export interface CheckReport extends Report {
  kind: 'check';
}
export interface CheckOptions {
  /** Timed runs of the first reference case after one warm-up (default 0: none). */
  latencyRuns?: number;
}

// -- the ViT class ----------------------------------------------------------------------------
export type Precision = 'fp32' | 'fp16' | 'int8' | 'int8-static' | 'int4' | (string & {});
export type Provider = 'cpu' | 'wasm' | 'webgpu';

export interface LoadOptions {
  /** Default 'fp32'. */
  precision?: Precision;
  /** An integer from 1 to 256 (Python's MAX_THREADS; anything else is an Error). Default:
   * ONNX Runtime's, or what `vit-deploy web --threads` wrote (checked the same way). */
  threads?: number;
  /** Browser: 'auto' (WebGPU when offered, else WebAssembly), 'webgpu', 'wasm'; Node: 'cpu'. */
  backend?: 'auto' | 'webgpu' | 'wasm' | 'cpu';
  /** Browser: where onnxruntime-web's dist files are served (ort.wasm.min.mjs, .wasm, ...);
   * default ./ort/ beside the entry module, as `vit-deploy web` lays a site out. */
  ortBase?: string | URL;
  /** External-data files beside the model; default: what `vit-deploy web` recorded. */
  externalData?: string[];
  /** Run sizes whose attention-memory estimate exceeds 80% of the available memory (Python's
   * RuntimeOptions.allow_large); default false: such a size is an Error before anything is
   * allocated for it. */
  allowLarge?: boolean;
}

export interface Info {
  backend: 'onnxruntime-node' | 'onnxruntime-web';
  /** Set when an int8 file needs a CPU this one may not be. */
  cpuWarning: string | null;
  provider: Provider;
  precision: Precision;
  threadsRequested: number | null;
  threads: number | null;
  /** Why fewer threads run than were asked for (browser). */
  threadFallback: string | null;
  /** Why WebGPU is not used (browser). */
  fallback: string | null;
  crossOriginIsolated: boolean | null;
  ortVersion: string | null;
  /** The WebGPU adapter the session runs on (browser, provider webgpu); else null. */
  gpu: string | null;
  modelBytes: number | null;
  downloadMs: number;
  sessionMs: number;
  /** Whether run() / runAll() take a batch's images one at a time: dynamic int8 quantises
   * activations per tensor, coupling a batch's images (Python's ViTSession.split_batches). */
  splitBatches: boolean;
}

export interface Timings {
  decode: number;
  preprocess: number;
  run: number;
}
export interface Classification {
  top: TopClass[];
  logits: Float32Array;
  /** [H, W] of the model input. */
  inputSize: [number, number];
  ms: Timings;
  provider: Provider;
}
export interface Features {
  /** [1, D, gh, gw], row-major. */
  data: Float32Array;
  dims: number[];
  output: string;
  inputSize: [number, number];
  ms: Timings;
  provider: Provider;
}
/** One image's embedding (vit.embed): the pooled output, unit length unless normalize: false. */
export interface Embedding {
  data: Float32Array;
  dim: number;
  output: string;
  normalized: boolean;
  similarity: 'cosine' | 'dot';
  inputSize: [number, number];
  ms: { prepare: number; run: number };
  provider: Provider;
}
export interface Output {
  data: Float32Array;
  dims: number[];
}

/** A loaded bundle's methods: `Image` is what the platform decodes (Pixels everywhere). */
export interface ViTMethods<Image> {
  readonly manifest: Manifest;
  readonly info: Info;
  readonly precision: Precision;
  /** The bundle's URL (a directory, with a trailing slash). */
  readonly url: string;
  readonly preprocess: Preprocess;
  /** LoadOptions.allowLarge: the attention-memory guard is off. */
  readonly allowLarge: boolean;
  readonly labels: string[] | null;
  /** The model's output names, in order. */
  readonly outputNames: string[];
  /** Raw logits (or a backbone's first output) for normalised pixels, dims [B, 3, H, W]. */
  run(data: Float32Array, dims: number[]): Promise<Float32Array>;
  /** Every output, or those named in `only`. A batch of dynamic int8 runs one image at a time
   * (info.splitBatches), as Python's ViTSession: each image's outputs are its own. */
  runAll(data: Float32Array, dims: number[], only?: string[] | null): Promise<Record<string, Output>>;
  /** The model input for an image (the manifest's preprocessing, with overrides). */
  pixels(image: Image, overrides?: PreprocessOverrides): Promise<Tensor4>;
  /** Classify one image; needs the bundle's `logits` output. topK: an integer >= 1 (default 5;
   * more than the classes gives them all); anything else is an Error. */
  classify(image: Image, options?: { topK?: number } & PreprocessOverrides): Promise<Classification>;
  /** One image's embedding, as Python's ViTSession.embed: the one-vector-per-image output
   * (pooled, else class_token), unit length (normalize: false for the raw vector). */
  embed(image: Image, options?: { normalize?: boolean; output?: string } & PreprocessOverrides): Promise<Embedding>;
  /** Dense features of one image: a grid output (patch_tokens or layer_N), resized with the
   * rule patch_multiple. */
  features(image: Image, options?: { output?: string } & PreprocessOverrides): Promise<Features>;
  /** The bundle's golden references against this runtime (the precision and provider
   * loaded), by the tolerance policy; a BundleError for a bundle without references. */
  check(options?: CheckOptions): Promise<CheckReport>;
  /** Free the ONNX Runtime session; every run method after it is an Error ("this ViT was
   * released"). */
  release(): Promise<void>;
}

// Every entry binds these to its platform (bindPlatform in src/lib/vit.mjs):
/** The URL of file `name` of the bundle at `base`: BundleError unless it stays inside it. */
export declare function bundleFile(base: URL, name: string, what?: string): Promise<URL>;
/** A warning for running an int8 file exact on `need` here; null when exact or not int8
 * (always null in the browser: WebAssembly's int8 kernels are exact on every CPU). */
export declare function int8Warning(need: Int8Cpu | null, facts?: CpuFacts): Promise<string | null>;
