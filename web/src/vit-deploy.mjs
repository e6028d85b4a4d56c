// vit-deploy's JavaScript runtime: a bundle (manifest.json + ONNX model) in the browser
// (onnxruntime-web: WebGPU when the browser offers an adapter, else WebAssembly) or in Node
// (onnxruntime-node), with the manifest's preprocessing reproduced from
// vit_deploy/runtime/preprocess.py: the same tensor as Python, bit for bit, from the same
// RGB pixels (the resize is Pillow's, written out in lib/resample.mjs; a canvas `drawImage`
// filter is unspecified, so the canvas is only used to decode).
//
//   import { ViT } from 'vit-deploy';   // the npm package; a site's copy: './vit-deploy.mjs'
//   const vit = await ViT.load('bundle/', { precision: 'fp32', threads: 2 });
//   const { top } = await vit.classify(fileOrBlobOrUrl);   // [{ index, label, probability }]
//   const logits = await vit.run(pixels, [1, 3, 224, 224]); // raw logits, Float32Array
//   const { data, dims } = await vit.features(image);       // [1, D, gh, gw] patch tokens
//   vit.info  // { backend, provider, threads, threadsRequested, fallback, ... }
//
// This entry runs in both: it asks once where it is and loads that platform's module. The
// entries for one platform, node.mjs and browser.mjs, import only their own (a bundler
// should take browser.mjs, or the package's "exports", which name both). The modules:
//   lib/common.mjs     constants (Python's: tests/website/test_web_constants.py), errors
//   lib/manifest.mjs   readManifest, bundleFile, checkNormalization, int8 and the CPU
//   lib/decode.mjs     pixels from images: EXIF orientation, the decompression-bomb guard
//   lib/resample.mjs   Pillow's resize, byte for byte
//   lib/preprocess.mjs Preprocess, toRGB, pyRound: runtime/preprocess.py
//   lib/results.mjs    softmax, topK, requireFinite
//   lib/vit.mjs        the ViT class, bindPlatform
//   lib/naflex.mjs     SigLIP 2 NaFlex: NaFlex, bindNaFlex (runtime/naflex/session.py)
//   lib/naflex-preprocess.mjs  NaFlexPreprocess, the NaFlex graph contract (runtime/naflex/)
//   lib/platform-node.mjs, lib/platform-browser.mjs   files, decoding, ONNX Runtime, threads
import { bindNaFlex } from './lib/naflex.mjs';
import { bindPlatform } from './lib/vit.mjs';

export * from './lib/api.mjs';
export { NaFlexPreprocess, sizeForMaxNumPatches } from './lib/naflex.mjs';

const IS_NODE = typeof process !== 'undefined' && !!process.versions?.node &&
  typeof window === 'undefined';
const platform = IS_NODE ? await import('./lib/platform-node.mjs')
  : await import('./lib/platform-browser.mjs');
export const { ViT, decodeImage, bundleFile, int8Warning } = bindPlatform(platform);
export const { NaFlex, naflexFeatures } = bindNaFlex(platform); // SigLIP 2 NaFlex graphs
