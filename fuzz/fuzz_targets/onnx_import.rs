//! Any bytes given to the ONNX importer yield a graph or an error, never a
//! panic: as given, and with the inputs' dynamic axes bound (as `--batch`
//! and `--seq` bind them).
#![no_main]

use autopar_import::onnx::{import_model_bytes, ImportOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = import_model_bytes(data, &ImportOptions::default());
    let bound = ImportOptions {
        dims: [("batch".to_string(), 2), ("seq".to_string(), 8)].into(),
        ..Default::default()
    };
    let _ = import_model_bytes(data, &bound);
});
