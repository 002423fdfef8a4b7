//! `read`: parse a file with apr-format's own readers and print what they saw.

use crate::{catch_panic, emit, f32_value, read_file, rejected, sha256_hex, GoldenModel, Misuse};
use apr_format::v2::{required_file_len, AprV2Reader};
use apr_format::{Header, ModelType, HEADER_SIZE, MAGIC};
use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
use serde_json::{json, Value};
use std::path::Path;

pub fn read(path: &Path, golden_model: bool) -> Result<(), Misuse> {
    let data = read_file(path, "file")?;
    // apr-format has no v1/v2 dispatcher: `load`/`load_from_bytes` only know
    // APRN. Anything that does not start with APRN goes to the v2 reader,
    // which then reports its own error for foreign magic.
    let (format, value) = if data.starts_with(&MAGIC) {
        ("v1", catch_panic(|| read_v1(&data, golden_model)))
    } else {
        ("v2", catch_panic(|| read_v2(&data)))
    };
    emit(&value.unwrap_or_else(|panic| rejected(format, "panic", panic)));
    Ok(())
}

// ---------------------------------------------------------------------------
// v2
// ---------------------------------------------------------------------------

fn read_v2(data: &[u8]) -> Value {
    let reader = match AprV2Reader::from_bytes(data) {
        Ok(r) => r,
        Err(e) => return rejected("v2", "parse", e),
    };
    let h = reader.header();
    // The reader does not check the footer; do it here, as aprender's golden tests do.
    let (body, footer) = data.split_at(data.len() - 4);
    let footer_crc_ok = apr_format::crc32(body).to_le_bytes() == footer;

    // The metadata as apr-format would write it back (`AprV2Metadata::to_json`),
    // parsed into a Value: typed fields after the reader's own parse, f32
    // fields in their shortest f32 form, custom keys included.
    let metadata = match reader.metadata().to_json() {
        Ok(text) => serde_json::from_slice(&text).unwrap_or(Value::Null),
        Err(e) => return rejected("v2", "metadata-reserialize", e),
    };

    let tensors: Vec<Value> = reader
        .tensor_index()
        .iter()
        .map(|e| {
            json!({
                "name": e.name,
                "dtype": e.dtype.to_string(),
                "dtype_id": e.dtype as u8,
                "shape": e.shape,
                "offset": e.offset,
                "size": e.size,
                "sha256": reader.get_tensor_data(&e.name).map(sha256_hex),
                "f32": reader
                    .get_f32_tensor(&e.name)
                    .map(|v| v.into_iter().map(f32_value).collect::<Vec<_>>()),
            })
        })
        .collect();

    json!({
        "ok": true,
        "format": "v2",
        "file_size": data.len(),
        "header": {
            "magic_hex": hex::encode(h.magic),
            "version": [h.version.0, h.version.1],
            "flags": h.flags.bits(),
            "tensor_count": h.tensor_count,
            "metadata_offset": h.metadata_offset,
            "metadata_size": h.metadata_size,
            "tensor_index_offset": h.tensor_index_offset,
            "data_offset": h.data_offset,
            "checksum": h.checksum,
            "checksum_ok": h.verify_checksum(),
            "reserved_hex": hex::encode(h.reserved),
        },
        "footer_crc_ok": footer_crc_ok,
        "required_file_len": required_file_len(data).ok(),
        "metadata": metadata,
        "tensors": tensors,
    })
}

// ---------------------------------------------------------------------------
// v1
// ---------------------------------------------------------------------------

fn read_v1(data: &[u8], golden_model: bool) -> Value {
    // `load_from_bytes` insists on an expected model type. Take it from the
    // file itself so that check passes; an unknown id falls back to
    // LinearRegression and the loader then reports "Unknown model type" itself.
    let model_type = data
        .get(6..8)
        .and_then(|b| ModelType::from_u16(u16::from_le_bytes([b[0], b[1]])))
        .unwrap_or(ModelType::LinearRegression);

    // 1. The loader: size, CRC32, header, type, bounds, decompression, bincode.
    let payload = match apr_format::load_from_bytes::<RawPayload>(data, model_type) {
        Ok(p) => p.0,
        Err(e) => return rejected("v1", "load", e),
    };
    let model = if golden_model {
        match apr_format::load_from_bytes::<GoldenModel>(data, model_type) {
            Ok(m) => Some(m),
            Err(e) => return rejected("v1", "golden-model", e),
        }
    } else {
        None
    };
    // 2. The metadata: `load` never decodes it; `inspect_bytes` does.
    let info = match apr_format::inspect_bytes(data) {
        Ok(i) => i,
        Err(e) => return rejected("v1", "metadata", e),
    };
    let header = match Header::from_bytes(&data[..HEADER_SIZE]) {
        Ok(h) => h,
        Err(e) => return rejected("v1", "header", e),
    };

    let payload_start = HEADER_SIZE + header.metadata_size as usize;
    let payload_end = payload_start + header.payload_size as usize;
    let stored_payload = &data[payload_start..payload_end];

    let mut out = json!({
        "ok": true,
        "format": "v1",
        "file_size": data.len(),
        "header": {
            "magic_hex": hex::encode(header.magic),
            "version": [header.version.0, header.version.1],
            "model_type": header.model_type as u16,
            "model_type_name": format!("{:?}", header.model_type),
            "metadata_size": header.metadata_size,
            "payload_size": header.payload_size,
            "uncompressed_size": header.uncompressed_size,
            "compression": header.compression as u8,
            "compression_name": format!("{:?}", header.compression),
            "flags": header.flags.bits(),
            "flags_raw": data[21],
            "quality_score": header.quality_score,
            "reserved_hex": hex::encode(&data[23..HEADER_SIZE]),
        },
        "metadata": serde_json::to_value(&info.metadata).unwrap_or(Value::Null),
        "payload_len": payload.len(),
        "payload_sha256": sha256_hex(&payload),
        "stored_payload_sha256": sha256_hex(stored_payload),
        "bytes_between_payload_and_crc": data.len() - 4 - payload_end,
    });
    if let Some(m) = model {
        out["model"] = json!({
            "name": m.name,
            "weights": m.weights.into_iter().map(f32_value).collect::<Vec<_>>(),
            "bias": f32_value(m.bias),
        });
    }
    out
}

/// The decompressed v1 payload, obtained through apr-format's own loader.
///
/// apr-format exposes no "give me the payload bytes" function: the decoding
/// step is private and `load_from_bytes::<M>` ends with `bincode::deserialize`.
/// This type asks bincode for a tuple of unbounded length and reads `u8`s
/// until bincode runs out of input. bincode 1.3's top-level `deserialize`
/// allows trailing bytes and has no size limit, so what comes out is exactly
/// the bytes the loader decompressed (the CRC, header, type and bounds checks
/// and the decompression all ran first).
struct RawPayload(Vec<u8>);

impl<'de> Deserialize<'de> for RawPayload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AllBytes;
        impl<'de> Visitor<'de> for AllBytes {
            type Value = RawPayload;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any bytes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawPayload, A::Error> {
                let mut bytes = Vec::new();
                // The end of input surfaces as an error from the next element.
                while let Ok(Some(b)) = seq.next_element::<u8>() {
                    bytes.push(b);
                }
                Ok(RawPayload(bytes))
            }
        }
        deserializer.deserialize_tuple(usize::MAX, AllBytes)
    }
}
