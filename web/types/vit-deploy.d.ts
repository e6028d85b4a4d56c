// The entry that runs in both (src/vit-deploy.mjs: it asks where it runs and loads that
// platform's module), for resolvers that pick neither the "node" nor the "browser" condition.
import type { LoadOptions, Pixels, ViTMethods } from './common.js';
import type { ImageInput as BrowserImage } from './browser.js';
import type { ImageInput as NodeImage } from './node.js';

export * from './common.js';

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
