// Bytes and text over fetch(): the browser's way to every file, and Node's to http(s) ones.
import { BundleError } from './common.mjs';

async function get(url, what) {
  try {
    return await fetch(url);
  } catch (e) {
    throw new BundleError(`${what} ${url} could not be fetched (${e.message})`);
  }
}

const failed = (response, url, what) => new BundleError(
  `${what} ${url}: HTTP ${response.status} ${response.statusText}`);

/** The bytes at `url`, or a BundleError naming `what` and why. */
export async function fetchBytes(url, what) {
  const response = await get(url, what);
  if (!response.ok) throw failed(response, url, what);
  return new Uint8Array(await response.arrayBuffer());
}

/** The text at `url`; null when `optional` and it is not there (404). */
export async function fetchText(url, what, { optional = false } = {}) {
  const response = await get(url, what);
  if (optional && response.status === 404) return null;
  if (!response.ok) throw failed(response, url, what);
  return response.text();
}
