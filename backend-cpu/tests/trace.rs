//! Timelines of real runs and of simulations: valid Chrome trace-event
//! JSON, every rank with compute and communication events, and no overlap
//! within a track.

use autopar_cost_models::{Calibration, Cluster};
use autopar_cpu::train;
use autopar_exec::trace::chrome_json;
use autopar_exec::train::{initialize, Optimizer, TokenSource};
use autopar_exec::TrainOptions;
use autopar_ir::interp::Precision;
use autopar_lower::{for_strategy, lower, Objective, Strategy};
use autopar_sim::{simulate, Pricing, PricingOptions, SimOptions};
use std::collections::BTreeMap;

#[test]
fn a_hybrid_run_traces_every_rank_and_stream() {
    let mut g = autopar_import::zoo::build("gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8").unwrap();
    initialize(&mut g, 1).unwrap();
    // dp2·tp2 with sequence parallelism on 4 ranks, and dp2·tp2·pp2 on 8.
    for s in [
        Strategy::new(2, 1, 4, 1, 2).with_tp(2, true),
        Strategy::new(2, 2, 4, 1, 2).with_tp(2, false),
    ] {
        let t = for_strategy(&g, &s, 8, Objective::Lm).unwrap();
        let programs = lower(&t, &s).unwrap();
        let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-3), 2);
        opts.trace = true;
        let report = train(
            &t,
            &programs,
            &TokenSource::synthetic(64, 1).into(),
            &opts,
            &|_| {},
        )
        .unwrap();
        let json = chrome_json(&report.trace, &(0..s.world()).collect::<Vec<_>>());
        check_trace(&json, &(0..s.world()).collect::<Vec<_>>());
    }
}

/// Parses the trace as JSON text and checks that every one of `ranks` has
/// compute and communication spans, that spans on one track never
/// overlap, and that memory counters are present.
fn check_trace(json: &serde_json::Value, ranks: &[usize]) {
    let text = serde_json::to_string(json).unwrap();
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
    for &rank in ranks {
        let rank = rank as u64;
        assert!(
            tracks.contains_key(&(rank, 0)),
            "rank {rank} has no compute events"
        );
        assert!(
            tracks.keys().any(|&(r, t)| r == rank && t > 0),
            "rank {rank} has no communication events"
        );
    }
    for ((rank, track), spans) in &mut tracks {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in spans.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0 + 1e-6,
                "rank {rank} track {track}: {w:?} overlap"
            );
        }
    }
}

#[test]
fn a_simulated_hybrid_plan_traces_every_rank_and_stream() {
    let g = autopar_import::zoo::build("gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8").unwrap();
    // dp2·pp2 and tp2·pp2 on 4 ranks, every rank replayed.
    for s in [
        Strategy::new(2, 2, 4, 1, 4),
        Strategy::new(1, 2, 4, 1, 4).with_tp(2, false),
    ] {
        let t = for_strategy(&g, &s, 8, Objective::Lm).unwrap();
        let cluster = Cluster::preset("dgx-a100-80g")
            .unwrap()
            .with_gpus(s.world())
            .unwrap();
        let calibration = Calibration::default();
        let pricing = Pricing::new(&t, &cluster, &calibration, &PricingOptions::default()).unwrap();
        let opts = SimOptions {
            every_rank: true,
            trace: true,
            ..SimOptions::default()
        };
        let sim = simulate(&t, &s, &pricing, &opts).unwrap();
        let ranks: Vec<usize> = (0..s.world()).collect();
        check_trace(&chrome_json(&sim.trace, &ranks), &ranks);
    }
}
