// Classify images with a bundle in Node: the npm package `vit-deploy` (the same module as
// the browser's), over onnxruntime-node. In an app: `npm install` the tarball `npm pack` writes in web/; in this
// repository `make setup` links node_modules/vit-deploy to web/, as npm would.
//
//   node examples/classify_node.mjs BUNDLE IMAGE... [--precision int8] [--top-k 5] [--threads 2]
//
// IMAGE: PNG or JPEG. The preprocessing is the manifest's, as in Python's `vit-deploy predict`.
import { parseArgs } from 'node:util';

import { ViT } from 'vit-deploy';

const usage = 'usage: node examples/classify_node.mjs BUNDLE IMAGE... [--precision P] [--top-k K] [--threads N]';
let args;
try {
  args = parseArgs({
    allowPositionals: true,
    options: { precision: { type: 'string', default: 'fp32' }, 'top-k': { type: 'string', default: '5' },
      threads: { type: 'string' } },
  });
} catch (e) {
  console.error(`${e.message}\n${usage}`);
  process.exit(2);
}
const [bundle, ...images] = args.positionals;
const topK = Number(args.values['top-k']);
const threads = args.values.threads === undefined ? undefined : Number(args.values.threads);
if (!bundle || images.length === 0 || !Number.isInteger(topK) || topK < 1 ||
  (threads !== undefined && !(Number.isInteger(threads) && threads >= 1))) {
  console.error(usage);
  process.exit(2);
}

try {
  const vit = await ViT.load(bundle, { precision: args.values.precision, threads });
  const { backend, provider, ortVersion } = vit.info;
  console.log(`${bundle} (${args.values.precision}) on ${backend} ${ortVersion}, ${provider}`);
  for (const image of images) {
    const r = await vit.classify(image, { topK });
    const best = r.top.map((c) => `${c.label ?? `class ${c.index}`} ${(100 * c.probability).toFixed(1)}%`);
    console.log(`${image} (${r.inputSize.join('x')}, ${r.ms.run.toFixed(1)} ms): ${best.join(', ')}`);
  }
  await vit.release();
} catch (e) {
  console.error(`Error: ${e.message}`);
  process.exit(e.name === 'ImageError' || e.name === 'BundleError' ? 2 : 1);
}
