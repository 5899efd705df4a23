//! Timelines of real runs: valid Chrome trace-event JSON, every rank with
//! compute and communication events, and no overlap within a track.

use autopar_runtime::cpu::parallel::trace::chrome_json;
use autopar_runtime::cpu::parallel::{train, TrainOptions};
use autopar_runtime::cpu::Precision;
use autopar_runtime::lower::{for_strategy, lower, Strategy};
use autopar_runtime::train::{initialize, Optimizer, TokenSource};
use std::collections::BTreeMap;

#[test]
fn a_hybrid_run_traces_every_rank_and_stream() {
    let mut g = autopar_ir::zoo::build("gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8").unwrap();
    initialize(&mut g, 1).unwrap();
    // dp2·tp2 with sequence parallelism on 4 ranks, and dp2·tp2·pp2 on 8.
    for s in [
        Strategy::new(2, 1, 4, 1, 2).with_tp(2, true),
        Strategy::new(2, 2, 4, 1, 2).with_tp(2, false),
    ] {
        let t = for_strategy(&g, &s, 8).unwrap();
        let programs = lower(&t, &s).unwrap();
        let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-3), 2);
        opts.trace = true;
        let report = train(&t, &programs, &TokenSource::synthetic(64, 1), &opts, &|_| {}).unwrap();
        let text = serde_json::to_string(&chrome_json(&report.trace, s.world())).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        let events = parsed["traceEvents"].as_array().unwrap();
        // (rank, track) → spans.
        let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
        let mut counters = 0;
        for e in events {
            match e["ph"].as_str().unwrap() {
                "X" => tracks
                    .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                    .or_default()
                    .push((e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap())),
                "C" => counters += 1,
                "M" => {}
                other => panic!("unexpected phase {other}"),
            }
        }
        assert!(counters > 0);
        for rank in 0..s.world() as u64 {
            for track in [0, 1] {
                let spans = tracks
                    .get_mut(&(rank, track))
                    .unwrap_or_else(|| panic!("rank {rank} track {track}"));
                spans.sort_by(|a, b| a.0.total_cmp(&b.0));
                for w in spans.windows(2) {
                    assert!(
                        w[0].0 + w[0].1 <= w[1].0 + 1e-6,
                        "rank {rank} track {track}: {w:?} overlap"
                    );
                }
            }
        }
    }
}
