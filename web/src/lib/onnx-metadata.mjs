// The metadata_props of an ONNX model file, read from its bytes without ONNX or protobuf:
// what vit.mjs compares with the manifest (the config the exporter stored).
/**
 * The metadata_props of an ONNX file (ModelProto field 14: key / value strings) read field
 * by field from `reader` ({ size, read(offset, length) -> bytes, close? }), skipping the
 * graph unread; null where the bytes do not parse (ONNX Runtime, which loaded them, is the
 * judge of the file: nothing to compare then, as Python with a foreign file).
 */
export async function modelMetadata(reader) {
  const { size, read } = reader;
  const out = {};
  let pos = 0;
  const varint = (bytes, at) => { // [value, bytes used]; null if broken
    let v = 0;
    for (let i = 0, mul = 1; i < Math.min(bytes.length - at, 10); i++, mul *= 128) {
      v += (bytes[at + i] & 0x7f) * mul;
      if (!(bytes[at + i] & 0x80)) return [v, i + 1];
    }
    return null;
  };
  const text = new TextDecoder();
  try {
    while (pos < size) {
      const head = await read(pos, Math.min(20, size - pos)); // a key and a length: 2 varints
      const key = varint(head, 0);
      if (!key) return null;
      const [tag, used] = key;
      const [field, wire] = [Math.floor(tag / 8), tag % 8];
      if (wire === 0) {
        const v = varint(head, used);
        if (!v) return null;
        pos += used + v[1];
      } else if (wire === 1 || wire === 5) {
        pos += used + (wire === 1 ? 8 : 4);
      } else if (wire === 2) {
        const n = varint(head, used);
        if (!n || pos + used + n[1] + n[0] > size) return null;
        pos += used + n[1];
        if (field === 14) { // StringStringEntryProto: 1 key, 2 value
          const entry = await read(pos, n[0]);
          const kv = {};
          for (let at = 0; at < entry.length;) {
            const k = varint(entry, at);
            const len = k && varint(entry, at + k[1]);
            if (!len || k[0] % 8 !== 2) return null;
            at += k[1] + len[1];
            kv[k[0] >> 3] = text.decode(entry.subarray(at, at + len[0]));
            at += len[0];
          }
          if (typeof kv[1] === 'string') out[kv[1]] = kv[2] ?? '';
        }
        pos += n[0];
      } else {
        return null;
      }
    }
    return out;
  } finally {
    await reader.close?.();
  }
}
