//! Any index text, read with a real rank file beside it, yields a
//! checkpoint or an error, never a panic or an allocation past the bytes
//! the files hold: the reader `--resume` and `export-weights` use.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::path::Path;

/// A rank file of two f32 pieces, as a checkpoint of a tiny model holds.
fn rank_file() -> Vec<u8> {
    let a: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let b: Vec<u8> = [0.5f32, -0.5].iter().flat_map(|x| x.to_le_bytes()).collect();
    let views = vec![
        ("w/weight/0/0", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &a).unwrap()),
        ("w/exp_avg/0/0", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &b).unwrap()),
    ];
    safetensors::tensor::serialize(views, None).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut files = BTreeMap::new();
    files.insert("rank-0.safetensors".to_string(), rank_file());
    let _ = autopar_exec::checkpoint::open_bytes(Path::new("ck/step-1"), text, &files);
});
