//! Any bytes given to the ONNX importer yield a graph or an error, never a panic.
#![no_main]

use autopar_import::onnx::{import_model_bytes, ImportOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = import_model_bytes(data, &ImportOptions::default());
});
