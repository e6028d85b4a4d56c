// Node: what only Node does, behind the interface both platform modules share (see vit.mjs's
// ViT.load). Files on disk (file: URLs and paths, symlinks resolved), PNG and JPEG decoding
// with pngjs and jpeg-js, onnxruntime-node's CPU provider, /proc/cpuinfo for int8.
import { constants } from 'node:fs';
import { open, readFile, realpath } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { backendPreference, BundleError, ImageError, MAX_PIXELS, show } from './common.mjs';
import { checkPixels, exifOrientation, orient } from './decode.mjs';
import { fetchBytes, fetchText } from './fetch.mjs';

/** What runs the model (info.backend). */
export const runtime = 'onnxruntime-node';

/** A bundle given as a path (not a URL): resolved against the working directory. */
export const baseURL = (text) => pathToFileURL(path.resolve(text) + path.sep);

/** For file: URLs, the real path (symlinks resolved) must stay inside the bundle's. */
export async function insideBundle(base, url, what, name) {
  if (url.protocol !== 'file:') return;
  let root;
  let real;
  try {
    root = await realpath(fileURLToPath(base));
    real = await realpath(fileURLToPath(url));
  } catch (e) {
    throw new BundleError(`${what} ${show(name)} could not be read from the bundle (${e.code ?? e.message})`);
  }
  if (!real.startsWith(root + path.sep)) {
    throw new BundleError(`${what} ${show(name)} resolves to ${real}, outside the bundle ${root} ` +
      `(a symlink leaving it?); refused`);
  }
}

// What a file that is not a regular file is, in words (Python's runtime/files.py file_kind).
const fileKind = (info) => (info.isDirectory() ? 'a directory' : info.isFIFO() ? 'a FIFO (named pipe)'
  : info.isCharacterDevice() ? 'a character device' : info.isBlockDevice() ? 'a block device'
    : info.isSocket() ? 'a socket' : 'not a regular file');

/**
 * A file handle of `target` if it is a regular file (symlinks followed), else a BundleError
 * saying what it is (Python's read_regular): opened without blocking and checked before any
 * read, so a FIFO is refused at once (it hung the reader) and /dev/zero is never read.
 */
async function openRegular(target, what, Refusal = BundleError) {
  const handle = await open(target, constants.O_RDONLY | constants.O_NONBLOCK);
  const info = await handle.stat();
  if (!info.isFile()) {
    await handle.close();
    const name = target instanceof URL ? fileURLToPath(target) : target;
    throw new Refusal(`${what} ${show(name)} is ${fileKind(info)}, not a file; refused`);
  }
  return { handle, size: info.size };
}

async function readRegular(url, what, encoding, Refusal = BundleError) {
  const { handle } = await openRegular(url, what, Refusal);
  try {
    return await handle.readFile(encoding);
  } finally {
    await handle.close();
  }
}

/** The text of a file of the bundle (from disk for file: URLs); null when `optional` and
 * it is not there. */
export async function readText(url, what, { optional = false } = {}) {
  if (url.protocol !== 'file:') return fetchText(url, what, { optional });
  try {
    return await readRegular(url, what, 'utf8');
  } catch (e) {
    if (e instanceof BundleError) throw e;
    if (optional && e.code === 'ENOENT') return null;
    throw new BundleError(`${what} ${url.pathname} could not be read (${e.code ?? e.message})`);
  }
}

/** The bytes of a file of the bundle (from disk for file: URLs). */
export async function readBytes(url, what) {
  if (url.protocol !== 'file:') return fetchBytes(url, what);
  try {
    return new Uint8Array(await readRegular(url, what));
  } catch (e) {
    if (e instanceof BundleError) throw e;
    throw new BundleError(`${what} ${url.pathname} could not be read (${e.code ?? e.message})`);
  }
}

/** The bundle as a report names it: its path, or its URL when not on disk. */
export const bundleName = (url) => (url.protocol === 'file:' ? fileURLToPath(url).replace(/[\\/]$/, '') : url.href);

/** The machine as a report names it (schema "vit-deploy-report": device). */
export function device(info) {
  return { runtime: `onnxruntime-node ${info.ortVersion}`,
    platform: `${process.platform} ${process.arch}, node ${process.versions.node}`,
    cpu: os.cpus()[0]?.model?.trim() || null, gpu: null };
}

/** PNG or JPEG bytes, or a path to them -> RGBA pixels, EXIF orientation applied. */
export async function decode(src) {
  let bytes = src;
  let what = 'image bytes';
  if (typeof src === 'string' || src instanceof URL) {
    what = `image ${JSON.stringify(String(src))}`;
    try {
      bytes = await readRegular(src, 'image', undefined, ImageError);
    } catch (e) {
      if (e instanceof ImageError) throw e;
      throw new ImageError(`${what} could not be read (${e.code ?? e.name}: ${e.message})`);
    }
  } else if (src instanceof ArrayBuffer) {
    bytes = new Uint8Array(src);
  }
  if (!ArrayBuffer.isView(bytes)) {
    throw new ImageError('expected PNG or JPEG bytes, a path, or pixels { data, width, height }, ' +
      `got ${src?.constructor?.name ?? typeof src}`);
  }
  bytes = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length === 0) throw new ImageError(`${what} is empty (0 bytes)`);
  const png = bytes.length >= 24 && bytes.readUInt32BE(0) === 0x89504e47;
  const jpeg = bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8;
  if (!png && !jpeg) throw new ImageError(`${what} is not a PNG or JPEG (in Node this module decodes those two)`);
  try {
    if (png) {
      checkPixels(bytes.readUInt32BE(16), bytes.readUInt32BE(20), what); // IHDR, before decoding
      const { PNG } = (await import('pngjs')).default;
      const { data, width, height } = PNG.sync.read(bytes);
      return { data, width, height, channels: 4 };
    }
    const jpegjs = (await import('jpeg-js')).default;
    const image = jpegjs.decode(bytes, { useTArray: true, formatAsRGBA: true,
      maxResolutionInMP: MAX_PIXELS / 1e6, maxMemoryUsageInMB: 2048 });
    checkPixels(image.width, image.height, what);
    return orient({ ...image, channels: 4 }, exifOrientation(bytes));
  } catch (e) {
    if (e instanceof ImageError) throw e;
    throw new ImageError(`${what} could not be decoded (${e?.name}: ${e?.message})`);
  }
}

/** Nothing sent: ONNX Runtime's native library collects telemetry (an event store under
 * ~/.cache/Microsoft/DeveloperTools/, uploaded when a network is there) unless
 * ORT_DISABLE_TELEMETRY is set when it loads; set here, before onnxruntime-node is imported,
 * as Python does in vit_deploy/__init__.py. Opt in with VIT_DEPLOY_ORT_TELEMETRY=1. */
export function quietOrt(env) {
  if (env.VIT_DEPLOY_ORT_TELEMETRY !== '1') env.ORT_DISABLE_TELEMETRY = '1';
}

/** onnxruntime-node, whose one backend is the CPU (`ortBase` is the browser's): 'auto' or
 * 'cpu'; anything else is an Error naming the choices. */
export async function loadOrt(backend) {
  backendPreference(backend, ['cpu']); // Node has one backend: 'auto', 'cpu' or 'cpu,cpu'
  quietOrt(process.env);
  try {
    return { ort: await import('onnxruntime-node'), backend: 'cpu' };
  } catch (e) {
    throw new Error(`onnxruntime-node is not installed here (${e.message}): it comes with ` +
      '`npm install vit-deploy` (in the repository: make setup)');
  }
}

/** The model for InferenceSession.create and the options only Node sets: a file: model by
 * its path (onnxruntime-node finds external data beside it), else its bytes and its
 * external data's. */
export async function sessionInputs({ threads, modelURL, external, base }) {
  const options = { executionProviders: ['cpu'] };
  if (threads) options.intraOpNumThreads = threads;
  if (modelURL.protocol === 'file:') {
    // onnxruntime-node opens the path itself: a FIFO there would block it for good
    await openRegular(fileURLToPath(modelURL), 'model').then(({ handle }) => handle.close(), (e) => {
      throw e instanceof BundleError ? e : new BundleError(`model ${modelURL.pathname} could not be read (${e.code ?? e.message})`);
    });
    return { model: fileURLToPath(modelURL), options, downloaded: 0 };
  }
  const model = await fetchBytes(modelURL, 'model');
  let downloaded = model.byteLength;
  if (external.length) {
    options.externalData = await Promise.all(external.map(async (name) => {
      const data = await fetchBytes(new URL(name, base), 'external data');
      downloaded += data.byteLength;
      return { path: name, data };
    }));
  }
  return { model, options, downloaded };
}

/** Bytes the OS says are available, as Python's sizes.available_memory: Linux's MemAvailable,
 * else what Node says is free (the attention-memory guard's limit; vit.mjs). */
export async function availableMemory() {
  try {
    const m = /^MemAvailable:\s+(\d+)\s+kB/m.exec(await readFile('/proc/meminfo', 'utf8'));
    if (m) return Number(m[1]) * 1024;
  } catch { /* not Linux: below */ }
  return os.freemem();
}

/** Positional reads of the model given to InferenceSession.create (its path, or its bytes):
 * { size, read(offset, length), close } for vit.mjs's metadata check, never the whole file. */
export async function modelReader(model) {
  if (typeof model !== 'string') {
    return { size: model.byteLength, read: async (at, n) => model.subarray(at, at + n) };
  }
  const { handle, size } = await openRegular(model, 'model');
  return {
    size,
    read: async (at, n) => {
      const buffer = new Uint8Array(n);
      const { bytesRead } = await handle.read(buffer, 0, n, at);
      return buffer.subarray(0, bytesRead);
    },
    close: () => handle.close(),
  };
}

/** Threads as info reports them: onnxruntime-node runs what it was asked for. */
export const threadInfo = ({ threads }) => ({ threads, threadFallback: null, crossOriginIsolated: null });

async function cpuFlags() {
  if (process.platform !== 'linux') return null;
  try {
    const text = await readFile('/proc/cpuinfo', 'utf8');
    const line = text.split('\n').find((l) => /^(flags|Features)\s*:/.test(l));
    return line ? line.split(':')[1].trim().split(/\s+/) : null;
  } catch { return null; }
}

/** The CPU onnxruntime-node's int8 kernels run on (manifest.mjs's int8Warning). */
export const cpu = { node: true, arch: process.arch, cpuFlags };
