//! `json-floats`, `json-f32`, `json-f64`, `json-value`: show exactly what
//! serde_json (the version in Cargo.lock) prints, for checking a Python
//! re-implementation of its number formatting and string escaping.

use crate::{emit, read_file, Misuse};
use serde_json::{json, Value};
use std::path::Path;

/// Each line `f32:xxxxxxxx` or `f64:xxxxxxxxxxxxxxxx` (hex bit pattern) gives
/// one output line, `serde_json::to_string` of that float. Blank lines and
/// lines starting with `#` are skipped.
pub fn json_floats(path: &Path) -> Result<(), Misuse> {
    let bytes = read_file(path, "float list")?;
    let text = String::from_utf8(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = String::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{}:{}: {line:?}", path.display(), n + 1);
        let printed = match line.split_once(':') {
            Some(("f32", bits)) if bits.len() == 8 => u32::from_str_radix(bits, 16)
                .map(|b| to_json_text(&f32::from_bits(b)))
                .map_err(|e| format!("{}: {e}", at()))?,
            Some(("f64", bits)) if bits.len() == 16 => u64::from_str_radix(bits, 16)
                .map(|b| to_json_text(&f64::from_bits(b)))
                .map_err(|e| format!("{}: {e}", at()))?,
            _ => {
                return Err(format!(
                    "{}: expected `f32:` + 8 hex digits or `f64:` + 16 hex digits",
                    at()
                ))
            }
        };
        out.push_str(&printed);
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// Decimal strings parsed with Rust's correctly rounded `str::parse::<f32>`.
pub fn json_decimal_f32(xs: &[&str]) -> Result<(), Misuse> {
    for x in xs {
        let v: f32 = x.parse().map_err(|e| format!("cannot parse {x:?} as f32: {e}"))?;
        println!("{}", to_json_text(&v));
    }
    Ok(())
}

/// Decimal strings parsed with Rust's correctly rounded `str::parse::<f64>`.
pub fn json_decimal_f64(xs: &[&str]) -> Result<(), Misuse> {
    for x in xs {
        let v: f64 = x.parse().map_err(|e| format!("cannot parse {x:?} as f64: {e}"))?;
        println!("{}", to_json_text(&v));
    }
    Ok(())
}

/// `{"ok": true, "json": "<serde_json::to_string of the parsed Value>"}`, or
/// `{"ok": false, "error": ...}` when serde_json rejects the input. The text
/// is wrapped in a JSON string so that a rejection cannot be mistaken for
/// output.
pub fn json_value(path: &Path) -> Result<(), Misuse> {
    let bytes = read_file(path, "JSON input")?;
    let result = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) => json!({"ok": true, "json": to_json_text(&v)}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    };
    emit(&result);
    Ok(())
}

fn to_json_text<T: serde::Serialize + ?Sized>(v: &T) -> String {
    // Serializing a float or a Value cannot fail (non-finite floats become null).
    serde_json::to_string(v).unwrap_or_else(|e| format!("<serde_json error: {e}>"))
}
