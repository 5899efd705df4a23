//! Timings of the IR's front end: building a trillion-parameter zoo model,
//! importing and canonicalising full-size GPT-2. Run with
//! `cargo bench -p autopar-rewrite --bench build`; prints the median of several runs.

use autopar_import::{onnx, zoo};
use autopar_rewrite::canonicalize;
use std::time::{Duration, Instant};

fn median<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn main() {
    let spec = "gpt:layers=128,hidden=25600,heads=160,vocab=51200,seq=2048";
    let t = median(11, || zoo::build(spec).expect("spec builds"));
    println!("zoo build  {spec}: {t:?} (median of 11)");

    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/models/gpt2-full.ts.weightless.onnx"
    );
    let t = median(5, || {
        onnx::load_model(std::path::Path::new(path)).expect("fixture imports")
    });
    println!("onnx import gpt2-full.ts.weightless: {t:?} (median of 5)");

    let graph = onnx::load_model(std::path::Path::new(path)).expect("fixture imports");
    let t = median(5, || canonicalize(&graph).expect("rewrites"));
    println!("canonicalize gpt2-full.ts.weightless: {t:?} (median of 5)");
}
