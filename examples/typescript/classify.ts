// Typed use of the npm package in Node (the declarations under web/types/): classify an
// image, read the features of another, and handle the package's errors.
//
//   npm install vit-deploy typescript
//   npx tsc -p tsconfig.json        (checks; run the compiled .js, or use classify_node.mjs)
import { BundleError, ImageError, type Classification, type Features, ViT } from 'vit-deploy';

async function main(bundle: string, image: string): Promise<number> {
  let vit: ViT;
  try {
    vit = await ViT.load(bundle, { precision: 'fp32', threads: 2 });
  } catch (e) {
    if (e instanceof BundleError) {
      console.error(`not a usable bundle: ${e.message}`);
      return 2;
    }
    throw e;
  }
  try {
    const result: Classification = await vit.classify(image, { topK: 3 });
    for (const { label, index, probability } of result.top) {
      console.log(`${label ?? `class ${index}`}: ${(100 * probability).toFixed(1)} %`);
    }
    console.log(`${vit.info.backend} ${vit.info.ortVersion} on ${vit.info.provider}, ` +
      `${result.inputSize.join('x')} input, ${result.ms.run.toFixed(1)} ms`);
    if (vit.outputNames.includes('patch_tokens')) {
      const dense: Features = await vit.features(image, { resolution: 224 });
      console.log(`patch tokens ${dense.dims.join('x')}`);
    }
    if (vit.manifest.references) { // the proof on this machine, without torch
      const report = await vit.check();
      console.log(`check ${report.passed ? 'passed' : 'FAILED'}: ${report.cases.length} cases, ${report.reference}`);
    }
    const { data, dims } = await vit.pixels(image);
    const logits: Float32Array = await vit.run(data, dims);
    console.log(`${logits.length} logits; session inputs ${vit.session?.inputNames.join(', ')}`);
    return 0;
  } catch (e) {
    if (e instanceof ImageError) {
      console.error(`not a usable image: ${e.message}`);
      return 2;
    }
    throw e;
  } finally {
    await vit.release();
  }
}

const [bundle, image] = process.argv.slice(2);
process.exitCode = await main(bundle ?? 'bundle', image ?? 'image.png');
