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

// -- what the int8 weights need of a CPU: runtime/model_scan.py's int8_weights_need -------

const INT8 = 3; // TensorProto.DataType
const EXTERNAL = 1; // TensorProto.DataLocation

/** The fields of the protobuf message in [start, end) of `read`: { field, wire, value }
 * (varints) or { field, wire, at, length } (length-delimited, unread); throws on broken bytes. */
async function* fieldsOf(read, start, end) {
  for (let pos = start; pos < end;) {
    const head = await read(pos, Math.min(20, end - pos));
    const key = varintAt(head, 0);
    const [field, wire] = [Math.floor(key[0] / 8), key[0] % 8];
    if (wire === 0) {
      const v = varintAt(head, key[1]);
      yield { field, wire, value: v[0] };
      pos += key[1] + v[1];
    } else if (wire === 1 || wire === 5) {
      pos += key[1] + (wire === 1 ? 8 : 4);
    } else if (wire === 2) {
      const n = varintAt(head, key[1]);
      const at = pos + key[1] + n[1];
      if (at + n[0] > end) throw new Error('field past its message');
      yield { field, wire, at, length: n[0] };
      pos = at + n[0];
    } else {
      throw new Error(`wire type ${wire}`);
    }
  }
}

function varintAt(bytes, at) { // [value, bytes used] (values above 2^53 lose their low bits)
  let v = 0;
  for (let i = 0, mul = 1; i < Math.min(bytes.length - at, 10); i++, mul *= 128) {
    v += (bytes[at + i] & 0x7f) * mul;
    if (!(bytes[at + i] & 0x80)) return [v, i + 1];
  }
  throw new Error('broken varint');
}

/** int32 varints (packed int32_data: int8 values there), negatives as 10-byte two's complement. */
function int32sOf(bytes) {
  const out = [];
  for (let at = 0; at < bytes.length;) {
    const [v, used] = varintAt(bytes, at);
    out.push(v >= 2 ** 63 ? v - 2 ** 64 : v);
    at += used;
  }
  return out;
}

/**
 * What the int8 weights in an ONNX file need of a CPU, read from its bytes (only the
 * tensors' headers, and the int8 ones' values): 'vnni' when a weight matrix holds a value
 * outside [-64, 64] (8-bit weights, which saturate the 16-bit pair sums of x86 with AVX2
 * only), 'any' when every int8 weight fits, null when it has none or the bytes do not parse.
 */
export async function int8WeightsNeed(reader) {
  const { size, read } = reader;
  let need = null;
  try {
    for await (const graph of fieldsOf(read, 0, size)) {
      if (graph.field !== 7 || graph.wire !== 2) continue; // ModelProto.graph
      for await (const init of fieldsOf(read, graph.at, graph.at + graph.length)) {
        if (init.field !== 5 || init.wire !== 2) continue; // GraphProto.initializer
        const t = { dims: 0, type: 0, external: false, raw: null, int32: null };
        for await (const f of fieldsOf(read, init.at, init.at + init.length)) {
          if (f.field === 1) t.dims += f.wire === 2 ? int32sOf(await read(f.at, f.length)).length : 1;
          else if (f.field === 2 && f.wire === 0) t.type = f.value;
          else if (f.field === 14 && f.wire === 0) t.external = f.value === EXTERNAL;
          else if (f.field === 9 && f.wire === 2) t.raw = f;
          else if (f.field === 5) t.int32 = f;
          if (f.field === 2 && t.type !== INT8) break; // its values are never read
        }
        if (t.type !== INT8 || t.dims < 2 || t.external) continue;
        const values = t.raw ? new Int8Array((await read(t.raw.at, t.raw.length)).slice().buffer)
          : t.int32?.wire === 2 ? int32sOf(await read(t.int32.at, t.int32.length)) : [];
        for (const v of values) if (v < -64 || v > 64) return 'vnni';
        need = 'any';
      }
    }
    return need;
  } catch {
    return null;
  } finally {
    await reader.close?.();
  }
}

/**
 * Whether the graph quantises activations per tensor at run time (DynamicQuantizeLinear,
 * DynamicQuantizeMatMul: one scale for a whole batch, so a batch's images change each
 * other's outputs), read from the op types of the file's nodes, as Python's inspect_model
 * reads the file, not the recipe; `fallback` where the bytes do not parse.
 */
export async function batchCoupled(reader, fallback) {
  const { size, read } = reader;
  const text = new TextDecoder();
  try {
    for await (const graph of fieldsOf(read, 0, size)) {
      if (graph.field !== 7 || graph.wire !== 2) continue; // ModelProto.graph
      for await (const node of fieldsOf(read, graph.at, graph.at + graph.length)) {
        if (node.field !== 1 || node.wire !== 2) continue; // GraphProto.node
        const bytes = await read(node.at, node.length); // small: names and attributes
        const local = async (at, n) => bytes.subarray(at - node.at, at - node.at + n);
        for await (const f of fieldsOf(local, node.at, node.at + node.length)) {
          if (f.field === 4 && f.wire === 2 && // NodeProto.op_type
            text.decode(await local(f.at, f.length)).startsWith('DynamicQuantize')) return true;
        }
      }
    }
    return false;
  } catch {
    return fallback;
  } finally {
    await reader.close?.();
  }
}
