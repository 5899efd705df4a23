//! Any text given to the JSON graph reader yields a graph or an error, never a panic.
#![no_main]

use autopar_ir::json::from_json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = from_json(text);
    }
});
