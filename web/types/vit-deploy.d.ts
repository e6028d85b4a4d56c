// The entry that runs in both (src/vit-deploy.mjs: it asks where it runs and loads that
// platform's module), for resolvers that pick neither the "node" nor the "browser" condition.
import type { LoadOptions, Pixels, ViTMethods } from './common.js';
import type { NaFlexFeatures, NaFlexLoadOptions, NaFlexMethods } from './naflex.js';
import type { ImageInput as BrowserImage } from './browser.js';
import type { ImageInput as NodeImage } from './node.js';

export * from './common.js';
export * from './naflex.js';

/** What either platform decodes (see node.d.ts and browser.d.ts). */
export type ImageInput = NodeImage | BrowserImage;

/** A bundle loaded for inference: `ViT.load(source)` makes one. */
export interface ViT extends ViTMethods<ImageInput> {
  /** onnxruntime-node's or onnxruntime-web's InferenceSession. */
  readonly session: unknown;
}
export declare class ViT {
  /** Load the bundle at `source` (a URL of its directory; in Node also a path). */
  static load(source: string | URL, options?: LoadOptions): Promise<ViT>;
}

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
