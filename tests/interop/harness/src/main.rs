//! `apr-interop`: a small command-line front end to the crates.io `apr-format`
//! crate (the Rust implementation of `.apr` used by aprender), so that the
//! Python library aprfast can be checked against it byte for byte.
//!
//! Every subcommand prints JSON (or, for `json-floats`, one JSON token per
//! line) on stdout. A file or value that apr-format rejects is a result, not a
//! failure: it is reported as `{"ok": false, ...}` with exit status 0. Exit
//! status 2 means the harness itself was misused (bad arguments, unreadable or
//! malformed spec).  See README.md for the spec and output formats.

mod jsonfmt;
mod read;
mod write;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::any::Any;
use std::path::Path;
use std::process::ExitCode;

const USAGE: &str = "\
usage: apr-interop <command> [args]

commands:
  write-v2 SPEC.json OUT.apr        write a v2 (APR\\0) file with AprV2Writer / AprV2StreamingWriter
  write-v1 SPEC.json OUT.apr        write a v1 (APRN) file with apr_format::save
  read FILE.apr [--golden-model]    parse with apr-format's readers, print canonical JSON
  json-floats FILE                  lines 'f32:xxxxxxxx' / 'f64:xxxxxxxxxxxxxxxx' -> serde_json text
  json-f32 X...                     decimal strings parsed as f32 -> serde_json text, one per line
  json-f64 X...                     decimal strings parsed as f64 -> serde_json text, one per line
  json-value FILE.json              parse into serde_json::Value, print serde_json::to_string of it

exit status: 0 = ran (even if apr-format rejected the input; see \"ok\"), 2 = harness misuse";

/// The model that aprender's v1 golden fixture was saved from. The field
/// order is part of the bincode payload layout and must stay exactly this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenModel {
    pub name: String,
    pub weights: Vec<f32>,
    pub bias: f32,
}

/// Harness misuse: reported on stderr, exit status 2.
pub type Misuse = String;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("apr-interop: error: {msg}");
            eprintln!("(run `apr-interop --help` for usage)");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<(), Misuse> {
    let Some(cmd) = args.first() else {
        return Err("no command given".to_string());
    };
    let rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    match (cmd.as_str(), rest.as_slice()) {
        ("-h" | "--help" | "help", _) => {
            println!("{USAGE}");
            Ok(())
        }
        ("write-v2", [spec, out]) => write::write_v2(Path::new(spec), Path::new(out)),
        ("write-v1", [spec, out]) => write::write_v1(Path::new(spec), Path::new(out)),
        ("read", [file]) => read::read(Path::new(file), false),
        ("read", [file, "--golden-model"]) | ("read", ["--golden-model", file]) => {
            read::read(Path::new(file), true)
        }
        ("json-floats", [file]) => jsonfmt::json_floats(Path::new(file)),
        ("json-f32", xs) if !xs.is_empty() => jsonfmt::json_decimal_f32(xs),
        ("json-f64", xs) if !xs.is_empty() => jsonfmt::json_decimal_f64(xs),
        ("json-value", [file]) => jsonfmt::json_value(Path::new(file)),
        (
            "write-v2" | "write-v1" | "read" | "json-floats" | "json-f32" | "json-f64"
            | "json-value",
            _,
        ) => Err(format!("wrong arguments; usage:\n{}", usage_line(cmd))),
        _ => Err(format!("unknown command `{cmd}`")),
    }
}

/// The line of USAGE that describes `cmd`.
fn usage_line(cmd: &str) -> &'static str {
    let prefix = format!("  {cmd} ");
    USAGE.lines().find(|l| l.starts_with(&prefix)).unwrap_or(USAGE)
}

/// Print one JSON value on its own line (compact, keys sorted).
pub fn emit(value: &Value) {
    println!("{value}");
}

/// `{"ok": false, ...}` for an input that apr-format rejected (or panicked on).
pub fn rejected(format: &str, stage: &str, error: impl ToString) -> Value {
    json!({"ok": false, "format": format, "stage": stage, "error": error.to_string()})
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Read a whole file; failing to read a file the caller named is misuse.
pub fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, Misuse> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

/// Read and deserialize a JSON spec file.
pub fn read_spec<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, Misuse> {
    let bytes = read_file(path, "spec")?;
    serde_json::from_slice(&bytes).map_err(|e| format!("bad spec {}: {e}", path.display()))
}

/// Run `f`, turning a panic inside apr-format into an error message, so that
/// an assert in the library under test shows up as a result, not a crash.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| panic_message(&*p))
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic: (non-string payload)".to_string()
    }
}

/// An f32 as exact JSON: finite values widen losslessly to f64 (so
/// `0.1f32` prints as `0.10000000149011612`); NaN and infinities, which JSON
/// cannot hold, become the strings "NaN", "inf", "-inf".
pub fn f32_value(x: f32) -> Value {
    if x.is_nan() {
        json!("NaN")
    } else if x.is_infinite() {
        json!(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        json!(f64::from(x))
    }
}
