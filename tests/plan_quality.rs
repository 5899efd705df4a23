//! The planner against Megatron-LM's published configurations (SC'21
//! Table 1): for every row, the plan found is at least as fast, under the
//! same cost model and the same 80 GB per GPU, as the configuration the
//! experts published.

use autopar_cost_models::{estimate, published, Calibration, Cluster, Workload};
use autopar_planner::{search, SearchOptions};

#[test]
fn every_plan_beats_or_matches_the_published_configuration() {
    let calibration = Calibration::default();
    println!(
        "row  gpus  published (tp pp)  published_s  plan (dp tp pp v mb zero)  plan_s  configs  search_s"
    );
    for (i, r) in published::megatron_sc21().iter().enumerate() {
        let graph = r
            .model_spec()
            .parse::<autopar_import::ModelSpec>()
            .unwrap()
            .build()
            .unwrap();
        let cluster = Cluster::preset(&r.setting.cluster)
            .unwrap()
            .with_gpus(r.gpus)
            .unwrap();
        let w = Workload::build(&graph, &r.workload_options()).unwrap();
        let published = estimate(&w, &cluster, &calibration, &r.config())
            .unwrap()
            .step_time_s;
        let opts = SearchOptions {
            limits: autopar_planner::search::DegreeLimits::NONE,
            global_batch: r.batch,
            seq: None,
            max_memory_fraction: 1.0,
            attention: r.config().attention,
            dropout: r.config().dropout,
            moe_capacity_factor: None,
            objective: None,
            top: 1,
            tp_comm_overlap: false,
        };
        let found = search(&graph, &cluster, &calibration, &opts, &|_, _| {}).unwrap();
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
