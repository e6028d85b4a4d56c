// The public names that are the same on every platform; each entry (vit-deploy.mjs,
// node.mjs, browser.mjs) exports these and binds ViT, decodeImage, bundleFile and
// int8Warning to its platform (vit.mjs's bindPlatform).
export {
  BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, BundleError, ImageError, INT8_CPUS, INTERPOLATIONS,
  isGridOutput, LOGITS, MAX_ABS_MEAN, MAX_PIXELS, MAX_SCALE, MAX_SIDE, MAX_STD, MIN_CROP_PCT,
  MIN_SCALE, MIN_STD, OutputError, PATCH_TOKENS, RESIZE_RULES, WEB_RECORD, X86_INT8_EXACT,
} from './common.mjs';
export { exifOrientation, orient } from './decode.mjs';
export { nearestNeighbours, npyBytes } from './embedding.mjs';
export { checkNormalization, exactInt8, int8Cpu, int8Recipe, readManifest } from './manifest.mjs';
export { purposeOfOutputs, readPurpose } from './purpose.mjs';
export { Preprocess, pyRound, toRGB } from './preprocess.mjs';
export { resize } from './resample.mjs';
export { probabilities, requireFinite, sigmoid, softmax, topK } from './results.mjs';
export {
  compare, COSINE_MIN, FP32_ABS_TOL, mergeReports, pixelInput, seededInput, toleranceClass,
} from './check.mjs';
