// vit-deploy's JavaScript runtime in a browser: onnxruntime-web (WebGPU when the browser
// offers an adapter, else WebAssembly), images decoded by the browser. The same API as the
// Node entry (node.mjs); vit-deploy.mjs picks one of the two where it runs. Imports nothing
// of Node's, so a bundler can take it as it is.
//
//   import { ViT } from 'vit-deploy';   // package.json "exports": browser -> this file
//   const vit = await ViT.load('bundle/', { precision: 'fp32', threads: 2 });
//   const { top } = await vit.classify(fileOrBlobOrUrl);
import * as platform from './lib/platform-browser.mjs';
import { bindNaFlex } from './lib/naflex.mjs';
import { bindPlatform } from './lib/vit.mjs';

export * from './lib/api.mjs';
export { NaFlexPreprocess, sizeForMaxNumPatches } from './lib/naflex.mjs';
export const { ViT, decodeImage, bundleFile, int8Warning } = bindPlatform(platform);
export const { NaFlex, naflexFeatures } = bindNaFlex(platform); // SigLIP 2 NaFlex graphs
