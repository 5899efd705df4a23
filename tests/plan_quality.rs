//! The planner against Megatron-LM's published configurations (SC'21
//! Table 1): for every row, the plan found is at least as fast, under the
//! same cost model and the same 80 GB per GPU, as the configuration the
//! experts published.

use autopar::estimate::{run, Request};
use autopar_cost_models::{AttentionKernel, Calibration, Cluster, Recompute, Schedule};
use autopar_planner::{search, SearchOptions};

const TABLE: &str = include_str!("../fixtures/megatron_sc21_table1.json");

#[derive(serde::Deserialize)]
struct Table {
    rows: Vec<Row>,
}

#[derive(serde::Deserialize)]
struct Row {
    heads: usize,
    hidden: usize,
    layers: usize,
    tp: usize,
    pp: usize,
    gpus: usize,
    batch: usize,
}

#[test]
fn every_plan_beats_or_matches_the_published_configuration() {
    let table: Table = serde_json::from_str(TABLE).unwrap();
    println!(
        "row  gpus  published (tp pp)  published_s  plan (dp tp pp v mb zero)  plan_s  configs  search_s"
    );
    for (i, r) in table.rows.iter().enumerate() {
        let model = format!(
            "gpt:layers={},hidden={},heads={},vocab=51200,seq=2048,dtype=bf16",
            r.layers, r.hidden, r.heads
        );
        let published = run(&Request {
            model: model.clone(),
            cluster: "dgx-a100-80g".into(),
            gpus: r.gpus,
            tp: r.tp,
            pp: r.pp,
            dp: None,
            virtual_stages: None,
            sp: false,
            cp: 1,
            ep: 1,
            zero: 0,
            global_batch: r.batch,
            micro_batch: Some(1),
            seq: None,
            recompute: Recompute::Full,
            schedule: if r.pp > 1 {
                Schedule::Interleaved
            } else {
                Schedule::OneFOneB
            },
            attention: AttentionKernel::Unfused,
            dropout: true,
            overlap_grad_reduce: false,
            calibration: None,
        })
        .unwrap()
        .estimate
        .step_time_s;
        let graph = model.parse::<autopar_ir::ModelSpec>().unwrap().build().unwrap();
        let cluster = Cluster::preset("dgx-a100-80g")
            .unwrap()
            .with_gpus(r.gpus)
            .unwrap();
        let opts = SearchOptions {
            global_batch: r.batch,
            seq: None,
            max_memory_fraction: 1.0,
            attention: AttentionKernel::Unfused,
            dropout: true,
            top: 1,
        };
        let found = search(&graph, &cluster, &Calibration::default(), &opts, &|_, _| {}).unwrap();
        let best = &found.ranked[0];
        let c = &best.config;
        println!(
            "{:>3}  {:>4}  {:>17}  {:>11.3}  {:>3} {:>2} {:>2} {:>2} {:>2} {:>4}     {:>7.3}  {:>7}  {:>8.3}",
            i + 1,
            r.gpus,
            format!("{} {}", r.tp, r.pp),
            published,
            c.dp,
            c.tp,
            c.pp,
            c.virtual_stages,
            c.micro_batch,
            c.zero,
            best.estimate.step_time_s,
            found.configs_evaluated,
            found.seconds
        );
        assert!(
            best.estimate.step_time_s <= published * (1.0 + 1e-9),
            "row {}: plan {} s, published {} s",
            i + 1,
            best.estimate.step_time_s,
            published
        );
    }
}
