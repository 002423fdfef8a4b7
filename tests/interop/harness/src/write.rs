//! `write-v2` and `write-v1`: build a file with apr-format's own writers.

use crate::{catch_panic, emit, read_file, read_spec, rejected, sha256_hex, GoldenModel, Misuse};
use apr_format::v2::{
    AprV2Flags, AprV2Metadata, AprV2StreamingWriter, AprV2Writer, TensorDType, V2FormatError,
};
use apr_format::{Compression, Metadata, ModelType, SaveOptions};
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::Path;

// ---------------------------------------------------------------------------
// write-v2
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V2Spec {
    /// Deserialized into `AprV2Metadata` with `serde_json::from_value`.
    metadata: Value,
    #[serde(default)]
    tensors: Vec<TensorSpec>,
    /// `[shard_count, shard_index]` -> `AprV2Writer::with_sharding`.
    #[serde(default)]
    sharding: Option<(usize, usize)>,
    /// `AprV2Writer::with_lz4_compression` (sets the flag only).
    #[serde(default)]
    lz4_flag: bool,
    /// `AprV2Writer::set_header_flags`, applied before `lz4_flag` / `sharding`.
    #[serde(default)]
    header_flags: Option<u16>,
    /// "memory" (default, `AprV2Writer`) or "streaming" (`AprV2StreamingWriter`).
    #[serde(default)]
    writer: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorSpec {
    name: String,
    shape: Vec<usize>,
    /// Raw form: a dtype name plus the tensor bytes in hex.
    dtype: Option<String>,
    data_hex: Option<String>,
    /// Float form: values (JSON numbers, or strings parsed by Rust's
    /// `str::parse::<f32>` such as "0.1", "NaN", "-inf") ...
    f32: Option<Vec<Value>>,
    /// ... or the little-endian f32 bytes in hex (exact bit patterns).
    f32_hex: Option<String>,
    /// Which writer method gets the floats: "f32" (default), "f16", "q8", "q4".
    #[serde(rename = "as")]
    as_kind: Option<String>,
}

/// One tensor, already validated, ready to hand to a writer.
enum Tensor {
    Raw { dtype: TensorDType, bytes: Vec<u8> },
    Floats { kind: FloatKind, values: Vec<f32> },
}

#[derive(Clone, Copy)]
enum FloatKind {
    F32,
    F16,
    Q8,
    Q4,
}

pub fn write_v2(spec_path: &Path, out: &Path) -> Result<(), Misuse> {
    let spec: V2Spec = read_spec(spec_path)?;
    let metadata: AprV2Metadata = serde_json::from_value(spec.metadata)
        .map_err(|e| format!("spec `metadata` does not deserialize into AprV2Metadata: {e}"))?;
    let tensors = spec
        .tensors
        .iter()
        .map(|t| parse_tensor(t).map(|parsed| (t.name.clone(), t.shape.clone(), parsed)))
        .collect::<Result<Vec<_>, Misuse>>()?;

    let streaming = match spec.writer.as_deref() {
        None | Some("memory") => false,
        Some("streaming") => true,
        Some(other) => {
            return Err(format!("spec `writer` must be \"memory\" or \"streaming\", got {other:?}"))
        }
    };
    if streaming && (spec.lz4_flag || spec.sharding.is_some() || spec.header_flags.is_some()) {
        return Err("AprV2StreamingWriter has no lz4/sharding/header-flag setters; \
                    drop `lz4_flag`, `sharding` and `header_flags` or use the memory writer"
            .to_string());
    }

    let outcome = if streaming {
        catch_panic(|| write_v2_streaming(metadata, tensors, out))
    } else {
        catch_panic(|| {
            let mut writer = AprV2Writer::new(metadata);
            if let Some(bits) = spec.header_flags {
                writer.set_header_flags(AprV2Flags::from_bits(bits));
            }
            if spec.lz4_flag {
                writer.with_lz4_compression();
            }
            if let Some((count, index)) = spec.sharding {
                writer.with_sharding(count, index);
            }
            for (name, shape, tensor) in tensors {
                add_to_memory_writer(&mut writer, name, shape, tensor);
            }
            writer
                .write()
                .and_then(|bytes| std::fs::write(out, bytes).map_err(|e| io_err(out, &e)))
        })
    };
    report_write("v2", out, outcome)
}

fn add_to_memory_writer(w: &mut AprV2Writer, name: String, shape: Vec<usize>, t: Tensor) {
    match t {
        Tensor::Raw { dtype, bytes } => w.add_tensor(name, dtype, shape, bytes),
        Tensor::Floats { kind: FloatKind::F32, values } => w.add_f32_tensor(name, shape, &values),
        Tensor::Floats { kind: FloatKind::F16, values } => w.add_f16_tensor(name, shape, &values),
        Tensor::Floats { kind: FloatKind::Q8, values } => w.add_q8_tensor(name, shape, &values),
        Tensor::Floats { kind: FloatKind::Q4, values } => w.add_q4_tensor(name, shape, &values),
    }
}

fn write_v2_streaming(
    metadata: AprV2Metadata,
    tensors: Vec<(String, Vec<usize>, Tensor)>,
    out: &Path,
) -> Result<(), V2FormatError> {
    let mut w = AprV2StreamingWriter::new(metadata)?;
    for (name, shape, t) in tensors {
        match t {
            Tensor::Raw { dtype, bytes } => w.add_tensor(name, dtype, shape, &bytes)?,
            Tensor::Floats { kind, values } => match kind {
                FloatKind::F32 => w.add_f32_tensor(name, shape, &values)?,
                FloatKind::F16 => w.add_f16_tensor(name, shape, &values)?,
                FloatKind::Q8 => w.add_q8_tensor(name, shape, &values)?,
                FloatKind::Q4 => w.add_q4_tensor(name, shape, &values)?,
            },
        }
    }
    w.finalize(out)
}

fn io_err(path: &Path, e: &std::io::Error) -> V2FormatError {
    V2FormatError::IoError(format!("{}: {e}", path.display()))
}

fn parse_tensor(t: &TensorSpec) -> Result<Tensor, Misuse> {
    let ctx = |msg: String| format!("tensor {:?}: {msg}", t.name);
    let raw = t.dtype.is_some() || t.data_hex.is_some();
    let floats = t.f32.is_some() || t.f32_hex.is_some() || t.as_kind.is_some();
    match (raw, floats) {
        (true, false) => {
            let (Some(dtype), Some(hex)) = (&t.dtype, &t.data_hex) else {
                return Err(ctx("raw form needs both `dtype` and `data_hex`".to_string()));
            };
            Ok(Tensor::Raw {
                dtype: parse_dtype(dtype).map_err(ctx)?,
                bytes: decode_hex(hex).map_err(|e| ctx(format!("`data_hex`: {e}")))?,
            })
        }
        (false, true) => {
            let kind = match t.as_kind.as_deref() {
                None | Some("f32") => FloatKind::F32,
                Some("f16") => FloatKind::F16,
                Some("q8") => FloatKind::Q8,
                Some("q4") => FloatKind::Q4,
                Some(other) => {
                    return Err(ctx(format!("`as` must be f32, f16, q8 or q4, got {other:?}")))
                }
            };
            let values = match (&t.f32, &t.f32_hex) {
                (Some(list), None) => parse_f32_list(list).map_err(ctx)?,
                (None, Some(hex)) => f32_from_le_hex(hex).map_err(ctx)?,
                _ => return Err(ctx("give exactly one of `f32` and `f32_hex`".to_string())),
            };
            Ok(Tensor::Floats { kind, values })
        }
        _ => Err(ctx(
            "give either `dtype` + `data_hex`, or `f32`/`f32_hex` (+ optional `as`)".to_string(),
        )),
    }
}

fn parse_dtype(name: &str) -> Result<TensorDType, String> {
    Ok(match name {
        "F32" => TensorDType::F32,
        "F16" => TensorDType::F16,
        "BF16" => TensorDType::BF16,
        "F64" => TensorDType::F64,
        "I32" => TensorDType::I32,
        "I64" => TensorDType::I64,
        "I8" => TensorDType::I8,
        "U8" => TensorDType::U8,
        "Q4K" | "Q4_K" => TensorDType::Q4K,
        "Q6K" | "Q6_K" => TensorDType::Q6K,
        "AprQ4" | "APR_Q4" => TensorDType::AprQ4,
        "AprQ8" | "APR_Q8" => TensorDType::AprQ8,
        other => {
            return Err(format!(
                "unknown dtype {other:?} (expected F32 F16 BF16 F64 I32 I64 I8 U8 Q4K Q6K AprQ4 AprQ8)"
            ))
        }
    })
}

fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    hex::decode(&compact).map_err(|e| e.to_string())
}

fn f32_from_le_hex(s: &str) -> Result<Vec<f32>, String> {
    let bytes = decode_hex(s).map_err(|e| format!("`f32_hex`: {e}"))?;
    if bytes.len() % 4 != 0 {
        return Err(format!("`f32_hex` has {} bytes, not a multiple of 4", bytes.len()));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn parse_f32_list(list: &[Value]) -> Result<Vec<f32>, String> {
    list.iter()
        .enumerate()
        .map(|(i, v)| match v {
            #[allow(clippy::cast_possible_truncation)]
            Value::Number(n) => n
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| format!("`f32`[{i}]: {n} is not representable")),
            Value::String(s) => s
                .parse::<f32>()
                .map_err(|e| format!("`f32`[{i}]: cannot parse {s:?} as f32: {e}")),
            other => Err(format!("`f32`[{i}]: expected a number or string, got {other}")),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// write-v1
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V1Spec {
    model: GoldenModel,
    /// `ModelType` u16 id, e.g. 1 = LinearRegression.
    model_type: u16,
    /// `Compression` u8 id; absent = `Compression::default()` (ZstdDefault).
    #[serde(default)]
    compression: Option<u8>,
    #[serde(default)]
    quality_score: Option<u8>,
    /// Deserialized into the v1 `Metadata` struct; absent = `Metadata::default()`
    /// (current time and apr-format's own version: not reproducible).
    #[serde(default)]
    metadata: Option<Value>,
}

pub fn write_v1(spec_path: &Path, out: &Path) -> Result<(), Misuse> {
    let spec: V1Spec = read_spec(spec_path)?;
    let model_type = ModelType::from_u16(spec.model_type)
        .ok_or_else(|| format!("spec `model_type` {} is not a known ModelType id", spec.model_type))?;
    let compression = match spec.compression {
        None => Compression::default(),
        Some(id) => Compression::from_u8(id)
            .ok_or_else(|| format!("spec `compression` {id} is not 0, 1, 2 or 3"))?,
    };
    let metadata: Metadata = match spec.metadata {
        None => Metadata::default(),
        Some(v) => serde_json::from_value(v)
            .map_err(|e| format!("spec `metadata` does not deserialize into Metadata: {e}"))?,
    };
    let options = SaveOptions { compression, metadata, quality_score: spec.quality_score };
    let outcome = catch_panic(|| apr_format::save(&spec.model, model_type, out, options));
    report_write("v1", out, outcome)
}

// ---------------------------------------------------------------------------

/// Print the result of a write: the file's size and sha256, or why
/// apr-format refused (an error it returned, or a panic inside it).
fn report_write<E: std::fmt::Display>(
    format: &str,
    out: &Path,
    outcome: Result<Result<(), E>, String>,
) -> Result<(), Misuse> {
    let value = match outcome {
        Err(panic) => rejected(format, "write", panic),
        Ok(Err(e)) => rejected(format, "write", e),
        Ok(Ok(())) => {
            let bytes = read_file(out, "written file")?;
            json!({
                "ok": true,
                "format": format,
                "path": out.display().to_string(),
                "size": bytes.len(),
                "sha256": sha256_hex(&bytes),
            })
        }
    };
    emit(&value);
    Ok(())
}
