// Images to pixels: what both platforms share. The decoding itself is the platform's
// (platform-browser.mjs: the browser's decoders; platform-node.mjs: pngjs and jpeg-js).
import { ImageError, MAX_PIXELS } from './common.mjs';

/** An ImageError unless a `width` x `height` image is at least 1x1 and within MAX_PIXELS. */
export function checkPixels(width, height, what) {
  if (width < 1 || height < 1) throw new ImageError(`${what} is ${width}x${height}: expected at least 1x1 pixels`);
  if (width * height > MAX_PIXELS) {
    throw new ImageError(`${what} is ${width}x${height} = ${width * height} pixels, over the ` +
      `limit of ${MAX_PIXELS} (decompression-bomb guard)`);
  }
}

const isPixels = (x) => x && typeof x === 'object' && 'data' in x && 'width' in x && 'height' in x &&
  ArrayBuffer.isView(x.data);

/**
 * Any image `platform` can decode -> { data: RGBA or RGB bytes, width, height }. Browser: a
 * File / Blob, URL, ArrayBuffer, <img>, ImageBitmap, canvas or ImageData (decoded by the
 * browser at its own size, EXIF orientation applied, no colour conversion, never resized
 * by the canvas). Node: PNG or JPEG bytes or a path (pngjs, jpeg-js). Both: decoded pixels
 * { data, width, height }, returned as they are.
 */
export async function decodeImage(src, platform) {
  if (isPixels(src)) return src;
  return platform.decode(src);
}

/** The EXIF Orientation tag (1..8) of JPEG bytes; 1 when there is none. */
export function exifOrientation(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let p = 2;
  while (p + 4 <= view.byteLength && view.getUint8(p) === 0xff) {
    const marker = view.getUint8(p + 1);
    const length = view.getUint16(p + 2);
    if (marker === 0xda) break; // start of scan: no more metadata
    if (marker === 0xe1 && length >= 16 && view.getUint32(p + 4) === 0x45786966) { // "Exif"
      const tiff = p + 10;
      const little = view.getUint16(tiff) === 0x4949;
      const u16 = (o) => view.getUint16(o, little);
      const u32 = (o) => view.getUint32(o, little);
      const end = Math.min(view.byteLength, p + 2 + length);
      const ifd = tiff + u32(tiff + 4);
      if (ifd + 2 > end) return 1;
      const count = u16(ifd);
      for (let i = 0; i < count && ifd + 2 + i * 12 + 12 <= end; i++) {
        const entry = ifd + 2 + i * 12;
        if (u16(entry) === 0x0112) {
          const v = u16(entry + 8);
          return v >= 1 && v <= 8 ? v : 1;
        }
      }
      return 1;
    }
    p += 2 + length;
  }
  return 1;
}

/** Pixels turned upright by an EXIF orientation, as Pillow's ImageOps.exif_transpose. */
export function orient(image, orientation) {
  if (orientation === 1) return image;
  const { data, width: w, height: h } = image;
  const ch = image.channels ?? 4;
  const swap = orientation >= 5;
  const [W, H] = swap ? [h, w] : [w, h];
  const out = new Uint8Array(W * H * ch);
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      let sx; let sy; // the source pixel shown at (x, y)
      switch (orientation) {
        case 2: sx = w - 1 - x; sy = y; break;
        case 3: sx = w - 1 - x; sy = h - 1 - y; break;
        case 4: sx = x; sy = h - 1 - y; break;
        case 5: sx = y; sy = x; break;
        case 6: sx = y; sy = h - 1 - x; break;
        case 7: sx = w - 1 - y; sy = h - 1 - x; break;
        default: sx = w - 1 - y; sy = x; break; // 8
      }
      const s = (sy * w + sx) * ch;
      out.set(data.subarray(s, s + ch), (y * W + x) * ch);
    }
  }
  return { data: out, width: W, height: H, channels: ch };
}
