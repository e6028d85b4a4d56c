// The browser entry (src/browser.mjs, the "browser" condition of package.json's "exports"):
// onnxruntime-web on WebGPU or WebAssembly, images decoded by the browser.
import type { InferenceSession } from 'onnxruntime-web';

import type { LoadOptions, Pixels, ViTMethods } from './common.js';
import type { NaFlexFeatures, NaFlexLoadOptions, NaFlexMethods } from './naflex.js';

export * from './common.js';
export * from './naflex.js';

/** What the browser decodes (at the image's own size, EXIF orientation applied, no colour
 * conversion), or decoded pixels (ImageData is one). */
export type ImageInput = Blob | string | URL | ArrayBuffer | ArrayBufferView | HTMLImageElement |
  ImageBitmap | HTMLCanvasElement | OffscreenCanvas | ImageData | Pixels;

/** A bundle loaded for inference in the browser: `ViT.load(url)` makes one. */
export interface ViT extends ViTMethods<ImageInput> {
  readonly session: InferenceSession | null;
}
export declare class ViT {
  /** Load the bundle at `source`, a URL of its directory (relative: to the page). */
  static load(source: string | URL, options?: LoadOptions): Promise<ViT>;
}

/** An image as pixels: { data, width, height, channels }. */
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
