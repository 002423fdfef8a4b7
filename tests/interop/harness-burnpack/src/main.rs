//! burnpack-interop: drives the crates.io `burn-pack` crate (Burn's Burnpack reader and
//! writer) from JSON specs, so aprfast's tests can check both directions against it.
//!
//!   burnpack-interop write SPEC.json OUT.bpk   # Writer::into_bytes, then the bytes to OUT
//!   burnpack-interop read FILE.bpk             # Reader::from_file_exact, every tensor's bytes
//!
//! Output: one line of JSON on stdout. Exit 0 when the harness ran (a rejection by
//! burn-pack is {"ok": false, "error": ...}), 2 for misuse.

use std::collections::BTreeMap;
use std::process::exit;

use burn_pack::{Bytes, DType, Reader, Scalar, Tensor, Writer};
use burn_std::BoolStore;
use serde_json::{json, Map, Value};

fn die(msg: &str) -> ! {
    eprintln!("burnpack-interop: {msg}");
    exit(2)
}

fn dtype_of(name: &str) -> DType {
    match name {
        "F64" => DType::F64,
        "F32" => DType::F32,
        "Flex32" => DType::Flex32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "I16" => DType::I16,
        "I8" => DType::I8,
        "U64" => DType::U64,
        "U32" => DType::U32,
        "U16" => DType::U16,
        "U8" => DType::U8,
        "Bool" | "Bool(Native)" => DType::Bool(BoolStore::Native),
        "Bool(U8)" => DType::Bool(BoolStore::U8),
        "Bool(U32)" => DType::Bool(BoolStore::U32),
        other => die(&format!("unknown dtype {other:?}")),
    }
}

fn scalar_of(value: &Value) -> Scalar {
    let obj = value.as_object().filter(|o| o.len() == 1).unwrap_or_else(|| die("scalar must be {Kind: value}"));
    let (kind, v) = obj.iter().next().unwrap();
    match kind.as_str() {
        "Int" => Scalar::Int(v.as_i64().unwrap_or_else(|| die("Int needs an i64"))),
        "UInt" => Scalar::UInt(v.as_u64().unwrap_or_else(|| die("UInt needs a u64"))),
        "Float" => Scalar::Float(match v {
            Value::String(s) => s.parse::<f64>().unwrap_or_else(|_| die("Float string must parse as f64")),
            other => other.as_f64().unwrap_or_else(|| die("Float needs a number")),
        }),
        "Bool" => Scalar::Bool(v.as_bool().unwrap_or_else(|| die("Bool needs a bool"))),
        other => die(&format!("unknown scalar kind {other:?}")),
    }
}

fn write(spec_path: &str, out: &str) {
    let text = std::fs::read_to_string(spec_path).unwrap_or_else(|e| die(&format!("{spec_path}: {e}")));
    let spec: Value = serde_json::from_str(&text).unwrap_or_else(|e| die(&format!("{spec_path}: {e}")));
    let mut tensors = Vec::new();
    for t in spec["tensors"].as_array().unwrap_or_else(|| die("spec needs \"tensors\": [...]")) {
        let name = t["name"].as_str().unwrap_or_else(|| die("tensor needs a name")).to_string();
        let dtype = dtype_of(t["dtype"].as_str().unwrap_or_else(|| die("tensor needs a dtype")));
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap_or_else(|| die("tensor needs a shape"))
            .iter()
            .map(|d| d.as_u64().unwrap_or_else(|| die("dims are u64")) as usize)
            .collect();
        let data = hex::decode(t["data_hex"].as_str().unwrap_or("").replace(char::is_whitespace, ""))
            .unwrap_or_else(|e| die(&format!("data_hex: {e}")));
        let param_id = t.get("param_id").and_then(Value::as_u64);
        tensors.push(Tensor::new(name, dtype, shape, param_id, Bytes::from_bytes_vec(data)));
    }
    let mut writer = Writer::new(tensors);
    if let Some(meta) = spec.get("metadata").and_then(Value::as_object) {
        for (k, v) in meta {
            writer = writer.with_metadata(k, v.as_str().unwrap_or_else(|| die("metadata values are strings")));
        }
    }
    if let Some(scalars) = spec.get("scalars").and_then(Value::as_object) {
        for (k, v) in scalars {
            writer = writer.with_scalar(k, scalar_of(v));
        }
    }
    match writer.into_bytes() {
        Ok(bytes) => {
            let slice: &[u8] = &bytes;
            std::fs::write(out, slice).unwrap_or_else(|e| die(&format!("{out}: {e}")));
            println!("{}", json!({"ok": true, "path": out, "size": slice.len()}));
        }
        Err(e) => println!("{}", json!({"ok": false, "stage": "write", "error": e.to_string()})),
    }
}

fn scalar_json(s: &Scalar) -> Value {
    match s {
        Scalar::Int(v) => json!({"Int": v}),
        Scalar::UInt(v) => json!({"UInt": v}),
        // f64 bits in hex: JSON has no NaN and the comparison must be exact
        Scalar::Float(v) => json!({"Float": format!("{:016x}", v.to_bits())}),
        Scalar::Bool(v) => json!({"Bool": v}),
    }
}

fn read(path: &str) {
    let reader = match Reader::from_file_exact(path) {
        Ok(r) => r,
        Err(e) => {
            println!("{}", json!({"ok": false, "stage": "open", "error": e.to_string()}));
            return;
        }
    };
    let metadata: BTreeMap<String, String> = reader.metadata().clone();
    let scalars: Map<String, Value> = reader.scalars().iter().map(|(k, v)| (k.clone(), scalar_json(v))).collect();
    let tensors = match reader.into_tensors() {
        Ok(t) => t,
        Err(e) => {
            println!("{}", json!({"ok": false, "stage": "tensors", "error": e.to_string()}));
            return;
        }
    };
    let mut out = Vec::new();
    for t in tensors {
        let (name, dtype, shape, param_id) = (t.name.clone(), t.dtype, t.shape.clone(), t.param_id);
        match t.into_bytes() {
            Ok(bytes) => {
                let slice: &[u8] = &bytes;
                out.push(json!({"name": name, "dtype": format!("{dtype:?}"), "shape": shape.to_vec(),
                                "param_id": param_id, "data_hex": hex::encode(slice)}));
            }
            Err(e) => {
                println!("{}", json!({"ok": false, "stage": "data", "error": e.to_string()}));
                return;
            }
        }
    }
    println!("{}", json!({"ok": true, "metadata": metadata, "scalars": scalars, "tensors": out}));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("write") if args.len() == 4 => write(&args[2], &args[3]),
        Some("read") if args.len() == 3 => read(&args[2]),
        _ => die("usage: burnpack-interop write SPEC.json OUT.bpk | read FILE.bpk"),
    }
}
