// vit-deploy's JavaScript runtime in Node: onnxruntime-node, bundles from paths or file:
// URLs, PNG / JPEG decoded with pngjs and jpeg-js. The same API as the browser's entry
// (browser.mjs); vit-deploy.mjs picks one of the two where it runs.
//
//   import { ViT } from 'vit-deploy';   // package.json "exports": node -> this file
//   const vit = await ViT.load('path/to/bundle', { precision: 'int8', threads: 2 });
//   const { top } = await vit.classify('image.jpg');
import * as platform from './lib/platform-node.mjs';
import { bindNaFlex } from './lib/naflex.mjs';
import { bindPlatform } from './lib/vit.mjs';

export * from './lib/api.mjs';
export { NaFlexPreprocess, sizeForMaxNumPatches } from './lib/naflex.mjs';
export const { ViT, decodeImage, bundleFile, int8Warning } = bindPlatform(platform);
export const { NaFlex, naflexFeatures } = bindNaFlex(platform); // SigLIP 2 NaFlex graphs
