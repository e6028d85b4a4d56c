// The browser: what only a browser does, behind the interface both platform modules share
// (see vit.mjs's ViT.load). Files over fetch(), decoding by the browser's own decoders,
// onnxruntime-web on WebGPU or WebAssembly, WebAssembly threads and cross-origin isolation.
import { backendPreference, ImageError, show } from './common.mjs';
import { checkPixels } from './decode.mjs';
import { fetchBytes, fetchText } from './fetch.mjs';

/** What runs the model (info.backend). */
export const runtime = 'onnxruntime-web';

/** A bundle given as a relative URL: resolved against the page. */
export const baseURL = (text) => new URL(text, globalThis.location?.href);

/** Nothing past bundleFile's own checks: a server decides what a URL serves. */
export async function insideBundle() {}

/** The text of a file of the bundle; null when `optional` and it is not there (404). */
export const readText = fetchText;

/** The bytes of a file of the bundle. */
export const readBytes = fetchBytes;

/** The bundle as a report names it: its URL. */
export const bundleName = (url) => url.href;

/** The browser as a report names it (schema "vit-deploy-report": device); a browser does
 * not name its CPU. */
export function device(info) {
  return { runtime: `onnxruntime-web ${info.ortVersion}`,
    platform: globalThis.navigator?.userAgent ?? 'unknown browser', cpu: null, gpu: info.gpu };
}

/** The adapter as a report names it: vendor, architecture, description (a software one,
 * SwiftShader, says so: its speed is no GPU's). */
function adapterName(adapter) {
  const i = adapter.info ?? {};
  const name = [i.vendor, i.architecture, i.device, i.description].filter(Boolean).join(' ');
  return name || 'unnamed WebGPU adapter';
}

/**
 * A File / Blob, URL, ArrayBuffer, <img>, ImageBitmap, canvas or ImageData -> RGBA pixels:
 * decoded by the browser at its own size (EXIF orientation applied, no colour conversion),
 * read back from a canvas of that size, never resized by it.
 */
export async function decode(src) {
  let source = src;
  const what = typeof src === 'string' || src instanceof URL ? `image ${String(src)}` : 'image';
  try {
    if (typeof src === 'string' || src instanceof URL) {
      const response = await fetch(src);
      if (!response.ok) throw new ImageError(`${what}: HTTP ${response.status}`);
      source = await response.blob();
    } else if (src instanceof ArrayBuffer || ArrayBuffer.isView(src)) {
      source = new Blob([src]);
    }
    if (typeof HTMLImageElement !== 'undefined' && source instanceof HTMLImageElement) await source.decode();
    const bitmap = await createImageBitmap(source, { imageOrientation: 'from-image',
      premultiplyAlpha: 'none', colorSpaceConversion: 'none' });
    const { width, height } = bitmap;
    checkPixels(width, height, what);
    const canvas = typeof OffscreenCanvas !== 'undefined' ? new OffscreenCanvas(width, height)
      : Object.assign(document.createElement('canvas'), { width, height });
    const ctx = canvas.getContext('2d', { willReadFrequently: true, colorSpace: 'srgb' });
    ctx.drawImage(bitmap, 0, 0); // same size: a copy, no resampling
    bitmap.close?.();
    const { data } = ctx.getImageData(0, 0, width, height);
    return { data, width, height, channels: 4 };
  } catch (e) {
    if (e instanceof ImageError) throw e;
    throw new ImageError(`${what} could not be decoded (${e?.name}: ${e?.message})`);
  }
}

/** onnxruntime-web from `ortBase`: its WebGPU build when the browser offers an adapter
 * and `backend` prefers it ('auto', 'webgpu', or a list such as 'webgpu,wasm' in order of
 * preference), else the WebAssembly build; `noGpuReason` says why not. A single 'webgpu'
 * is strict: an Error where there is no adapter. */
export async function loadOrt(backend, ortBase) {
  const order = [...new Set(backendPreference(backend, ['webgpu', 'wasm']))];
  let adapter = null;
  let reason = `${order[0]} comes first in ${show(backend)}`;
  if (order[0] === 'auto' || order[0] === 'webgpu') {
    try {
      adapter = globalThis.navigator?.gpu ? await navigator.gpu.requestAdapter() : null;
      if (!adapter) reason = globalThis.navigator?.gpu ? 'the browser offers no WebGPU adapter' : 'this browser has no WebGPU';
    } catch (e) {
      reason = `WebGPU adapter request failed (${e.message})`;
    }
    if (!adapter && order.length === 1 && order[0] === 'webgpu') {
      throw new Error(`backend webgpu was asked for, but ${reason}`); // one backend: strict
    }
  }
  const file = adapter ? 'ort.webgpu.min.mjs' : 'ort.wasm.min.mjs';
  const ort = await import(new URL(file, ortBase).href);
  ort.env.wasm.wasmPaths = new URL('./', ortBase).href;
  return { ort, backend: adapter ? 'webgpu' : 'wasm', noGpuReason: reason,
    gpu: adapter ? adapterName(adapter) : null };
}

/** The model's bytes for InferenceSession.create and the options only the browser sets. */
export async function sessionInputs({ ort, backend, threads, modelURL, external, base }) {
  if (threads) ort.env.wasm.numThreads = threads;
  const options = { executionProviders: [backend] };
  const model = await fetchBytes(modelURL, 'model');
  if (external.length) {
    // onnxruntime-web does not look beside the model: each external file by name and URL
    options.externalData = external.map((name) => ({ path: name, data: new URL(name, base).href }));
  }
  return { model, options, downloaded: model.byteLength };
}

const WASM32_MEMORY = 2 ** 32; // all the memory a (32-bit) WebAssembly instance can address

/**
 * The memory the attention-memory guard may count on (vit.mjs), in bytes; null where the
 * browser does not say. A page cannot read what the OS has available: on WebAssembly the
 * bound is the 4 GiB a 32-bit instance addresses (less where the device says it has less),
 * on WebGPU the device memory the browser reports (navigator.deviceMemory, Chromium's).
 */
export async function availableMemory({ provider }) {
  const bounds = [];
  if (provider === 'wasm') bounds.push(WASM32_MEMORY);
  const gib = globalThis.navigator?.deviceMemory;
  if (typeof gib === 'number' && gib > 0) bounds.push(gib * 2 ** 30);
  return bounds.length ? Math.min(...bounds) : null;
}

/** Positional reads of the model's bytes (given to InferenceSession.create): { size, read }
 * for vit.mjs's metadata check. */
export async function modelReader(model) {
  return { size: model.byteLength, read: async (at, n) => model.subarray(at, at + n) };
}

/** Threads as info reports them: WebAssembly's, and why fewer than asked for. */
export function threadInfo({ ort, provider, threads }) {
  const active = provider === 'wasm' ? ort.env.wasm.numThreads : null;
  let threadFallback = null;
  if (provider === 'wasm' && threads && threads > active) {
    threadFallback = globalThis.crossOriginIsolated
      ? `WebAssembly threads are not supported here: running on ${active} thread(s), not ${threads}`
      : `the page is not cross-origin isolated (the server sends no COOP/COEP headers): ` +
        `WebAssembly runs on ${active} thread, not ${threads}`;
  }
  return { threads: active, threadFallback, crossOriginIsolated: !!globalThis.crossOriginIsolated };
}

/** WebAssembly's int8 kernels widen to 32 bits before they add: exact on every CPU. */
export const cpu = { node: false };
