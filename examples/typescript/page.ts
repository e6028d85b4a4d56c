// Typed use of the npm package in a page (the "browser" condition of its "exports"): a
// bundler or an import map resolves 'vit-deploy' to its browser entry; onnxruntime-web's
// files are served from `ortBase`.
import { type CheckReport, Preprocess, readManifest, topK, ViT } from 'vit-deploy';

const vit = await ViT.load('bundle/', {
  precision: 'int8',
  threads: 2,
  ortBase: '/node_modules/onnxruntime-web/dist/',
});
if (vit.info.threadFallback) console.warn(vit.info.threadFallback);

const input = document.querySelector<HTMLInputElement>('input[type=file]');
input?.addEventListener('change', async () => {
  const file = input.files?.[0];
  if (!file) return;
  const { top, provider } = await vit.classify(file, { topK: 5 });
  document.title = `${top[0].label ?? top[0].index} (${provider})`;
});

// The pieces under ViT, for a caller with its own pixels.
const manifest = readManifest(await (await fetch('bundle/manifest.json')).json());
const pre = Preprocess.fromManifest(manifest, { interpolation: 'bilinear' });
const canvas = new OffscreenCanvas(64, 48);
const pixels = canvas.getContext('2d')!.getImageData(0, 0, 64, 48);
const { data, dims } = pre.tensor(pixels);
const best = topK(await vit.run(data, dims), 1, manifest.labels)[0];
console.log(best.label, best.probability);

// The proof on this browser: the bundle's golden references, by the tolerance policy.
if (vit.manifest.references) {
  const report: CheckReport = await vit.check({ latencyRuns: 5 });
  const failed = report.cases.filter((c) => !c.passed).map((c) => `${c.label} ${c.output}`);
  console.log(`${report.passed ? 'passed' : `failed: ${failed.join(', ')}`} on ${vit.info.provider}` +
    ` (${report.device.gpu ?? 'no GPU'}), p50 ${report.latency[0]?.p50_ms.toFixed(1)} ms`);
}
