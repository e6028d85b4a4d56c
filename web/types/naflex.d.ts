// SigLIP 2 NaFlex (src/lib/naflex.mjs): runtime/naflex/preprocess.py's preprocessing and the
// exported NaFlex graph. Each entry declares the NaFlex class for its platform's images.
import type { CheckCase, CheckOptions, CheckReport, Pixels } from './common.js';

/** [H, W] a height x width image is resized to: transformers'
 * get_image_size_for_max_num_patches, the same sizes as Python. */
export declare function sizeForMaxNumPatches(height: number, width: number, patch: number,
  maxNumPatches: number): [number, number];

export interface NaFlexFields {
  /** Default 16; the graph's, when NaFlex.load makes one. */
  patchSize?: number;
  /** Each image's patch budget, 1 to 65536; default 256 (Siglip2ImageProcessor's). */
  maxNumPatches?: number;
  /** 1 or 3 values; default SigLIP 2's 0.5. */
  mean?: number[];
  std?: number[];
  /** Default 1 / 255. */
  scale?: number;
}

/** The graph's three inputs for a batch: (B, N, 3*P*P) float32, (B, N) int32, (B, 2) int64. */
export interface NaFlexBatch {
  pixelValues: { data: Float32Array; dims: [number, number, number] };
  pixelAttentionMask: { data: Int32Array; dims: [number, number] };
  spatialShapes: { data: BigInt64Array; dims: [number, number] };
}

/** Images -> NaFlexBatch, as Python's NaFlexPreprocess (Siglip2ImageProcessorPil's floats). */
export declare class NaFlexPreprocess {
  constructor(fields?: NaFlexFields);
  readonly patchSize: number;
  readonly maxNumPatches: number;
  readonly mean: number[];
  readonly std: number[];
  readonly scale: number;
  /** [gh, gw]: the patch grid a width x height image gets. */
  grid(width: number, height: number): [number, number];
  /** One image -> its patches (gh * gw, 3*P*P) and its grid. */
  patches(image: Pixels, out?: Float32Array | null): { data: Float32Array; grid: [number, number] };
  /** Images of any sizes -> one batch padded to maxNumPatches. */
  batch(images: Pixels | Pixels[]): NaFlexBatch;
}

export interface NaFlexLoadOptions {
  /** A bundle's model to load ('fp32', 'int8', ...); default 'fp32'. */
  precision?: string;
  /** Default: the bundle manifest's max_num_patches, else 256. */
  maxNumPatches?: number;
  /** Default: the bundle manifest's, else SigLIP 2's 0.5. */
  mean?: number[];
  std?: number[];
  /** An integer from 1 to 256; default: ONNX Runtime's. */
  threads?: number;
  /** Browser: 'auto', 'webgpu', 'wasm'; Node: 'cpu'. */
  backend?: 'auto' | 'webgpu' | 'wasm' | 'cpu';
  ortBase?: string | URL;
}

/** What features() gives: pooled (B, D), each image's tokens on its grid (gh, gw, D). */
export interface NaFlexFeatures {
  pooled: { data: Float32Array; dims: number[] };
  tokens: { data: Float32Array; dims: [number, number, number] }[];
  grids: [number, number][];
  ms: { decode: number; preprocess: number; run: number };
}

/** A NaFlex bundle's golden references (manifest `naflex_references`; references.bin):
 * PyTorch fp32 outputs of seeded images (generator "mulberry32-rgb8-v1", regenerated from
 * seed and size) of several aspect ratios. */
export interface NaFlexReferences {
  file: string;
  generator: 'mulberry32-rgb8-v1';
  /** What made the outputs, e.g. "pytorch fp32 (torch 2.13.0)". */
  source: string;
  /** Bytes of the file, as the manifest lists it. */
  size: number;
  sha256: string | null;
  cases: Array<{
    name: string;
    /** 1 to 64 images, one batch: each regenerated from its seed at [H, W]. */
    images: Array<{ seed: number; size: [number, number] }>;
    /** Output name (pooled, last_hidden_state) -> its float32 values' byte offset and shape. */
    outputs: Record<string, { offset: number; shape: number[] }>;
  }>;
}

/** One NaFlex reference case × output: its label is the case's name; `case` names its
 * images' sizes as Python's report does ("naflex mixed (64x64,32x128,...)"); resolution is
 * the first image's resized [H, W]; cosine the least of the images'. */
export interface NaFlexCheckCase extends CheckCase {
  case: string;
}
/** What `naflex.check()` returns: Python's `check --reference bundle --json` figures. */
export interface NaFlexCheckReport extends CheckReport {
  cases: NaFlexCheckCase[];
}

/** What NaFlex.load read of a NaFlex bundle's manifest.json (preprocess resize "naflex"). */
export interface NaFlexManifest {
  name: string | null;
  patchSize: number;
  maxNumPatches: number;
  mean: number[];
  std: number[];
  scale: number;
  /** precision -> model file, as in the manifest. */
  models: Record<string, string>;
  /** The precision loaded. */
  precision: string;
  /** What `vit-deploy web --threads` recorded (web.json), or null. */
  threads: number | null;
  /** The golden references, or null for a bundle without them. */
  references: NaFlexReferences | null;
  /** Whether the precision loaded quantises activations per batch (dynamic int8). */
  batchCoupled: boolean;
}

export interface NaFlexMethods<I> {
  readonly preprocess: NaFlexPreprocess;
  /** The bundle's manifest when loaded from a bundle folder; null for a bare model.onnx. */
  readonly manifest: NaFlexManifest | null;
  /** The bundle's precision loaded; null for a bare model.onnx. */
  readonly precision: string | null;
  readonly url: string;
  /** The bundle's folder URL; null for a bare model.onnx. */
  readonly bundle: string | null;
  readonly info: {
    backend: string;
    provider: string;
    threads: number | null;
    /** Why it runs on WebAssembly where WebGPU was asked or offered none; else null. */
    fallback: string | null;
    ortVersion: string | null;
    /** The WebGPU adapter that runs it (browser), else null. */
    gpu: string | null;
    /** Whether run() takes a batch's images one at a time (dynamic int8: batch-coupled). */
    splitBatches: boolean;
  };
  run(batch: NaFlexBatch): Promise<{ pooled: { data: Float32Array; dims: number[] };
    last_hidden_state: { data: Float32Array; dims: number[] } }>;
  features(images: I | I[]): Promise<NaFlexFeatures>;
  /** The bundle's golden references against this runtime (the precision and provider
   * loaded), by the tolerance policy, as Python's `vit-deploy check --reference bundle`;
   * a BundleError for a model without references (or a bare model.onnx). */
  check(options?: CheckOptions): Promise<NaFlexCheckReport>;
  release(): Promise<void>;
}
