//! Any text given to the cluster-TOML reader yields a cluster or an error
//! naming the field, never a panic; a cluster it accepts can be counted and
//! resized to its own size and to one GPU.
#![no_main]

use autopar_cost_models::Cluster;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cluster) = Cluster::from_toml(text, "fuzz.toml") else {
        return;
    };
    let gpus = cluster.gpus();
    let _ = cluster.node_of(gpus.saturating_sub(1));
    let _ = cluster.clone().with_gpus(gpus);
    let _ = cluster.with_gpus(1);
});
