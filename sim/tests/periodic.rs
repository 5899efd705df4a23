//! `simulate_model_plan_step` (two short replays past the pipeline's fill,
//! each lane extended to the plan's micro-batch count) gives the full
//! replay's step, for every schedule, ZeRO stage, recomputation policy and
//! parallel layout, on GPU clusters and on the CPU preset (whose ranks run
//! serially), and where data-parallel traffic falls behind the computation.

use autopar_cost_models::{Calibration, Cluster, Recompute, Schedule, TrainingConfig};
use autopar_planner::{plan_candidate, search, Candidate, ModelId, Plan, SearchOptions};
use autopar_sim::{simulate_model_plan, simulate_model_plan_step};

const GPT: &str = "gpt:layers=8,hidden=1024,heads=16,vocab=8192,seq=1024,dtype=bf16";
const GPT_F16: &str = "gpt:layers=8,hidden=1024,heads=16,vocab=8192,seq=1024,dtype=f16";
const TINY_F32: &str = "gpt:layers=4,hidden=64,heads=4,vocab=256,seq=64";
const MOE: &str =
    "moe:layers=4,hidden=1024,ffn=2048,heads=16,experts=4,top_k=2,vocab=8192,seq=1024,dtype=bf16";

/// `spec` on `gpus` GPUs of `preset` under `shape` (a changed copy of the
/// search's first candidate), made into its plan with `micro_batches`.
fn plan(
    spec: &str,
    preset: &str,
    gpus: usize,
    micro_batches: usize,
    shape: impl Fn(&mut TrainingConfig),
) -> (Plan, autopar_ir::Graph) {
    let graph = autopar_import::zoo::build(spec).unwrap();
    let cluster = Cluster::preset(preset).unwrap().with_gpus(gpus).unwrap();
    let calibration = Calibration::default();
    let opts = SearchOptions::runnable(gpus, 1);
    let found = search(&graph, &cluster, &calibration, &opts, &|_, _| {}).unwrap();
    let mut c: Candidate = found.ranked[0].clone();
    c.config.virtual_stages = 1;
    c.config.schedule = Schedule::OneFOneB;
    c.config.stages = None;
    shape(&mut c.config);
    let cfg = &mut c.config;
    cfg.global_batch = cfg.dp * cfg.micro_batch * micro_batches;
    c.estimate.micro_batches = micro_batches;
    let opts = SearchOptions::runnable(cfg.global_batch, 1);
    let id = ModelId {
        arg: spec,
        hash: String::new(),
    };
    let plan = plan_candidate(&graph, &id, &cluster, &calibration, &opts, &found, &c).unwrap();
    (plan, graph)
}

fn degrees(dp: usize, tp: usize, pp: usize, cp: usize) -> impl Fn(&mut TrainingConfig) {
    move |c| {
        c.dp = dp;
        c.tp = tp;
        c.sp = tp > 1;
        c.pp = pp;
        c.cp = cp;
        c.ep = 1;
        c.micro_batch = 1;
        c.zero = 1;
        c.recompute = Recompute::None;
    }
}

#[test]
fn extended_replays_give_the_full_replays_step() {
    let calibration = Calibration::default();
    type Shape = Box<dyn Fn(&mut TrainingConfig)>;
    let with = |base: Shape, change: Shape| -> Shape {
        Box::new(move |c| {
            base(c);
            change(c)
        })
    };
    let cases: Vec<(&str, &str, &str, usize, Shape)> = vec![
        (
            "1f1b pp 4",
            GPT,
            "dgx-a100-80g",
            16,
            Box::new(degrees(4, 1, 4, 1)),
        ),
        (
            "1f1b pp 4, ZeRO-0, full recomputation",
            GPT,
            "dgx-a100-80g",
            16,
            with(
                Box::new(degrees(4, 1, 4, 1)),
                Box::new(|c| {
                    c.zero = 0;
                    c.recompute = Recompute::Full;
                }),
            ),
        ),
        (
            "1f1b pp 2 tp 2 sp, ZeRO-2, selective recomputation",
            GPT,
            "dgx-h100",
            16,
            with(
                Box::new(degrees(4, 2, 2, 1)),
                Box::new(|c| {
                    c.zero = 2;
                    c.recompute = Recompute::Selective;
                }),
            ),
        ),
        (
            "1f1b pp 2 cp 2, ZeRO-3",
            GPT,
            "dgx-h100",
            16,
            with(Box::new(degrees(4, 1, 2, 2)), Box::new(|c| c.zero = 3)),
        ),
        (
            "gpipe pp 4",
            GPT,
            "dgx-a100-80g",
            16,
            with(
                Box::new(degrees(4, 1, 4, 1)),
                Box::new(|c| c.schedule = Schedule::Gpipe),
            ),
        ),
        (
            "interleaved pp 2 v 2",
            GPT,
            "dgx-a100-80g",
            16,
            with(
                Box::new(degrees(8, 1, 2, 1)),
                Box::new(|c| {
                    c.schedule = Schedule::Interleaved;
                    c.virtual_stages = 2;
                }),
            ),
        ),
        (
            "interleaved pp 4 v 2 tp 2 sp, ZeRO-2",
            GPT,
            "dgx-h100",
            32,
            with(
                Box::new(degrees(2, 2, 4, 1)),
                Box::new(|c| {
                    c.schedule = Schedule::Interleaved;
                    c.virtual_stages = 2;
                    c.zero = 2;
                }),
            ),
        ),
        (
            "no pipeline, ZeRO-2 traffic behind the computation",
            GPT_F16,
            "p3-v100",
            12,
            with(Box::new(degrees(16, 1, 1, 1)), Box::new(|c| c.zero = 2)),
        ),
        (
            "MoE pp 2 ep 2",
            MOE,
            "dgx-a100-80g",
            12,
            with(Box::new(degrees(4, 1, 2, 1)), Box::new(|c| c.ep = 2)),
        ),
        ("cpu pp 2", TINY_F32, "cpu", 8, Box::new(degrees(2, 1, 2, 1))),
    ];
    for (what, spec, preset, micro_batches, shape) in cases {
        let gpus_of = |c: &TrainingConfig| c.dp * c.tp * c.pp * c.cp;
        let mut probe = TrainingConfig::default();
        shape(&mut probe);
        let (plan, graph) = plan(spec, preset, gpus_of(&probe), micro_batches, shape);
        let p = &plan.parallel;
        assert_eq!(
            (p.dp, p.tp, p.pp, p.cp, p.ep, p.zero, p.schedule),
            (
                probe.dp,
                probe.tp,
                probe.pp,
                probe.cp,
                probe.ep,
                probe.zero,
                probe.schedule
            ),
            "{what}"
        );
        assert_eq!(p.micro_batches, micro_batches, "{what}");
        let full = simulate_model_plan(&plan, &graph, &calibration)
            .unwrap()
            .step_time_s;
        let fast = simulate_model_plan_step(&plan, &graph, &calibration).unwrap();
        eprintln!("{what}: full replay {full:.9} s, extended {fast:.9} s");
        assert!(
            (fast / full - 1.0).abs() < 1e-9,
            "{what}: the extended replays give {fast} s, the full replay {full} s"
        );
    }
}
