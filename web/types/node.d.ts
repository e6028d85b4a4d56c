// The Node entry (src/node.mjs, the "node" condition of package.json's "exports"):
// onnxruntime-node, bundles from paths or file: URLs, PNG / JPEG decoded in JavaScript.
import type { InferenceSession } from 'onnxruntime-node';

import type { LoadOptions, Pixels, ViTMethods } from './common.js';
import type { NaFlexFeatures, NaFlexLoadOptions, NaFlexMethods } from './naflex.js';

export * from './common.js';
export * from './naflex.js';

/** What Node decodes: PNG or JPEG bytes, a path or file: URL to them, or decoded pixels. */
export type ImageInput = string | URL | ArrayBuffer | ArrayBufferView | Pixels;

/** A bundle loaded for inference in Node: `ViT.load(path)` makes one. */
export interface ViT extends ViTMethods<ImageInput> {
  readonly session: InferenceSession | null;
}
export declare class ViT {
  /** Load the bundle at `source`: a directory path, a file: URL, or an http(s) URL. */
  static load(source: string | URL, options?: LoadOptions): Promise<ViT>;
}

/** An image as pixels: { data, width, height, channels } (EXIF orientation applied). */
export declare function decodeImage(image: ImageInput): Promise<Pixels>;

/** A SigLIP 2 NaFlex model.onnx (export_naflex) loaded for inference. */
export interface NaFlex extends NaFlexMethods<ImageInput> {}
export declare class NaFlex {
  /** Load `model` (a path or URL): a NaFlex bundle's folder (its manifest.json; a site's
   * bundle/ too), a model.onnx, or a folder holding one. */
  static load(model: string | URL, options?: NaFlexLoadOptions): Promise<NaFlex>;
}
/** Load, features(images), release. */
export declare function naflexFeatures(model: string | URL, images: ImageInput | ImageInput[],
  options?: NaFlexLoadOptions): Promise<NaFlexFeatures>;
