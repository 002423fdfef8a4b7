//! `apr-crypto-interop`: a small command-line front end to the encrypted and
//! signed v1 (`APRN`) code of the crates.io crate `aprender-core` (lib name
//! `aprender`, features `format-encryption`, `format-signing`,
//! `format-compression`), so that aprfast's `aprfast.crypto` / `aprfast.v1`
//! can be checked against the real Rust implementation in both directions.
//!
//! Every subcommand prints one line of JSON on stdout. A file that aprender
//! rejects (or panics on) is a result, not a failure: `{"ok": false, ...}`
//! with exit status 0. Exit status 2 means the harness was misused (bad
//! arguments, malformed hex, unreadable or malformed spec). See README.md.

use aprender::format::{
    load_as_recipient, load_encrypted, load_verified, save_encrypted, save_for_recipient,
    save_signed, Compression, Metadata, ModelType, SaveOptions, SigningKey, VerifyingKey,
    X25519PublicKey, X25519SecretKey,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::any::Any;
use std::path::Path;
use std::process::ExitCode;

const USAGE: &str = "\
usage: apr-crypto-interop <command> [args]

commands:
  save-encrypted SPEC.json OUT PASSWORD               aprender::format::save_encrypted
  save-for-recipient SPEC.json OUT RECIPIENT_PUB_HEX  aprender::format::save_for_recipient (X25519 public key)
  save-signed SPEC.json OUT SEED_HEX                  aprender::format::save_signed (Ed25519 seed)
  load-encrypted FILE PASSWORD                        aprender::format::load_encrypted::<GoldenModel>
  load-as-recipient FILE SECRET_HEX                   aprender::format::load_as_recipient::<GoldenModel>
  load-verified FILE [TRUSTED_PUB_HEX]                aprender::format::load_verified::<GoldenModel>
  x25519-public SECRET_HEX                            x25519-dalek PublicKey::from(&StaticSecret)
  ed25519-public SEED_HEX                             ed25519-dalek SigningKey::verifying_key

keys are 32 bytes as 64 hex digits. The load commands expect the model type the
file's header names (bytes 6..8; LinearRegression if unknown or too short).

exit status: 0 = ran (even if aprender rejected the input; see \"ok\"), 2 = harness misuse";

/// The model that aprender's v1 golden fixture was saved from (the same struct
/// as the `apr-interop` harness). The field order is the bincode layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GoldenModel {
    name: String,
    weights: Vec<f32>,
    bias: f32,
}

/// The `write-v1` spec of the `apr-interop` harness, unchanged.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V1Spec {
    model: GoldenModel,
    /// `ModelType` u16 id, e.g. 1 = LinearRegression.
    model_type: u16,
    /// `Compression` u8 id; absent = `Compression::default()` (ZstdDefault).
    #[serde(default)]
    compression: Option<u8>,
    /// Passed on in `SaveOptions`; the encrypted and signed writers ignore it.
    #[serde(default)]
    quality_score: Option<u8>,
    /// Deserialized into the v1 `Metadata` struct; absent = `Metadata::default()`.
    #[serde(default)]
    metadata: Option<Value>,
}

/// Harness misuse: reported on stderr, exit status 2.
type Misuse = String;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("apr-crypto-interop: error: {msg}");
            eprintln!("(run `apr-crypto-interop --help` for usage)");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<(), Misuse> {
    let Some(cmd) = args.first() else {
        return Err("no command given".to_string());
    };
    let rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let value = match (cmd.as_str(), rest.as_slice()) {
        ("-h" | "--help" | "help", _) => {
            println!("{USAGE}");
            return Ok(());
        }
        ("save-encrypted", [spec, out, password]) => {
            let (model, model_type, options) = read_spec(Path::new(spec))?;
            let password = password.to_string();
            report_save(Path::new(out), catch_panic(|| {
                save_encrypted(&model, model_type, out, options, &password)
            }))?
        }
        ("save-for-recipient", [spec, out, public_hex]) => {
            let (model, model_type, options) = read_spec(Path::new(spec))?;
            let public = X25519PublicKey::from(key32(public_hex, "RECIPIENT_PUB_HEX")?);
            report_save(Path::new(out), catch_panic(|| {
                save_for_recipient(&model, model_type, out, options, &public)
            }))?
        }
        ("save-signed", [spec, out, seed_hex]) => {
            let (model, model_type, options) = read_spec(Path::new(spec))?;
            let key = SigningKey::from_bytes(&key32(seed_hex, "SEED_HEX")?);
            report_save(Path::new(out), catch_panic(|| {
                save_signed(&model, model_type, out, options, &key)
            }))?
        }
        ("load-encrypted", [file, password]) => {
            let model_type = file_model_type(Path::new(file))?;
            let password = password.to_string();
            report_load(catch_panic(|| {
                load_encrypted::<GoldenModel>(file, model_type, &password)
            }))
        }
        ("load-as-recipient", [file, secret_hex]) => {
            let model_type = file_model_type(Path::new(file))?;
            let secret = X25519SecretKey::from(key32(secret_hex, "SECRET_HEX")?);
            report_load(catch_panic(|| {
                load_as_recipient::<GoldenModel>(file, model_type, &secret)
            }))
        }
        ("load-verified", [file]) => {
            let model_type = file_model_type(Path::new(file))?;
            report_load(catch_panic(|| load_verified::<GoldenModel>(file, model_type, None)))
        }
        ("load-verified", [file, trusted_hex]) => {
            let model_type = file_model_type(Path::new(file))?;
            match VerifyingKey::from_bytes(&key32(trusted_hex, "TRUSTED_PUB_HEX")?) {
                // ed25519-dalek refuses bytes that are not a curve point: that is
                // the library's verdict on the key, so a result, not misuse.
                Err(e) => rejected("key", format!("invalid trusted key: {e}"), None),
                Ok(trusted) => report_load(catch_panic(|| {
                    load_verified::<GoldenModel>(file, model_type, Some(&trusted))
                })),
            }
        }
        ("x25519-public", [secret_hex]) => {
            let secret = X25519SecretKey::from(key32(secret_hex, "SECRET_HEX")?);
            json!({"ok": true, "public": hex::encode(X25519PublicKey::from(&secret).as_bytes())})
        }
        ("ed25519-public", [seed_hex]) => {
            let key = SigningKey::from_bytes(&key32(seed_hex, "SEED_HEX")?);
            json!({"ok": true, "public": hex::encode(key.verifying_key().as_bytes())})
        }
        (
            "save-encrypted" | "save-for-recipient" | "save-signed" | "load-encrypted"
            | "load-as-recipient" | "load-verified" | "x25519-public" | "ed25519-public",
            _,
        ) => return Err(format!("wrong arguments; usage:\n{}", usage_line(cmd))),
        _ => return Err(format!("unknown command `{cmd}`")),
    };
    println!("{value}");
    Ok(())
}

/// The line of USAGE that describes `cmd`.
fn usage_line(cmd: &str) -> &'static str {
    let prefix = format!("  {cmd} ");
    USAGE.lines().find(|l| l.starts_with(&prefix)).unwrap_or(USAGE)
}

/// 64 hex digits -> 32 bytes; anything else is misuse.
fn key32(text: &str, what: &str) -> Result<[u8; 32], Misuse> {
    let bytes = hex::decode(text).map_err(|e| format!("{what}: not hex: {e}"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("{what}: a key is 32 bytes (64 hex digits), got {}", bytes.len()))
}

fn read_bytes(path: &Path, what: &str) -> Result<Vec<u8>, Misuse> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

fn read_spec(path: &Path) -> Result<(GoldenModel, ModelType, SaveOptions), Misuse> {
    let bytes = read_bytes(path, "spec")?;
    let spec: V1Spec = serde_json::from_slice(&bytes)
        .map_err(|e| format!("bad spec {}: {e}", path.display()))?;
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
    Ok((spec.model, model_type, options))
}

/// The model type the file's header names, so that the loaders' type check
/// passes and what is tested is the crypto; LinearRegression when the file is
/// too short or the id unknown (the loader then reports the real problem).
fn file_model_type(path: &Path) -> Result<ModelType, Misuse> {
    let bytes = read_bytes(path, "file")?;
    Ok(bytes
        .get(6..8)
        .and_then(|b| ModelType::from_u16(u16::from_le_bytes([b[0], b[1]])))
        .unwrap_or(ModelType::LinearRegression))
}

type Outcome<T> = Result<aprender::error::Result<T>, String>;

fn report_save(out: &Path, outcome: Outcome<()>) -> Result<Value, Misuse> {
    Ok(match outcome {
        Err(panic) => rejected("save", panic, None),
        Ok(Err(e)) => rejected("save", e.to_string(), Some(error_kind(&e))),
        Ok(Ok(())) => {
            let bytes = read_bytes(out, "written file")?;
            json!({
                "ok": true,
                "path": out.display().to_string(),
                "size": bytes.len(),
                "sha256": hex::encode(Sha256::digest(&bytes)),
            })
        }
    })
}

fn report_load(outcome: Outcome<GoldenModel>) -> Value {
    match outcome {
        Err(panic) => rejected("load", panic, None),
        Ok(Err(e)) => rejected("load", e.to_string(), Some(error_kind(&e))),
        Ok(Ok(model)) => json!({
            "ok": true,
            "model": {
                "name": model.name,
                "weights": model.weights.iter().copied().map(f32_value).collect::<Vec<_>>(),
                "bias": f32_value(model.bias),
            },
        }),
    }
}

/// `{"ok": false, ...}`: `kind` is the `AprenderError` variant (`null` for a panic).
fn rejected(stage: &str, error: String, kind: Option<String>) -> Value {
    json!({"ok": false, "stage": stage, "error": error, "kind": kind})
}

/// The variant name of an error, from its Debug text (`DecryptionFailed { .. }`).
fn error_kind(e: &impl std::fmt::Debug) -> String {
    let text = format!("{e:?}");
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("").to_string()
}

/// Run `f`, turning a panic inside aprender into an error message.
fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
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

/// An f32 as exact JSON (finite values widen losslessly to f64); NaN and the
/// infinities become the strings "NaN", "inf", "-inf".
fn f32_value(x: f32) -> Value {
    if x.is_nan() {
        json!("NaN")
    } else if x.is_infinite() {
        json!(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        json!(f64::from(x))
    }
}
