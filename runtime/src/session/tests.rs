use super::*;
use crate::cpu::parallel::{train, CpuRunner};
use autopar_cost_models::Cluster;
use autopar_planner::{plan_model, DegreeLimits, ModelId, SearchOptions};

const SPEC: &str = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8";

/// A zoo GPT and the plan the planner makes for it on 2 CPU ranks.
fn gpt_on_two_ranks() -> (Graph, Plan) {
    let graph = autopar_import::zoo::build(SPEC).unwrap();
    let cluster = Cluster::load("cpu").unwrap().with_gpus(2).unwrap();
    let opts = SearchOptions {
        global_batch: 4,
        seq: Some(8),
        max_memory_fraction: 0.9,
        attention: autopar_cost_models::AttentionKernel::Fused,
        dropout: false,
        top: 1,
        limits: DegreeLimits {
            ep: 1,
            grad_compression: false,
            ..DegreeLimits::NONE
        },
    };
    let model = ModelId {
        arg: SPEC,
        hash: "test".into(),
    };
    let plan = plan_model(
        &graph,
        &model,
        &cluster,
        &Calibration::default(),
        &opts,
        &|_, _| {},
    )
    .unwrap();
    (graph, plan)
}

fn options(calibration: Option<Calibration>) -> RunOptions {
    RunOptions {
        steps: 3,
        seed: 7,
        optimizer: Optimizer::adamw(1e-3),
        data: None,
        precision: Precision::F32,
        overlap: true,
        trace: false,
        calibration,
        rendezvous_wait: Duration::from_secs(5),
    }
}

/// The session trains exactly what the rank interpreter trains from the
/// same programs, data and options, and reports every rank.
#[test]
fn a_session_trains_what_the_interpreter_trains() {
    let (graph, plan) = gpt_on_two_ranks();
    assert_eq!(plan.mesh.ranks.len(), 2);
    let session = Session::new(plan, graph, 8, options(None), LaunchEnv::single()).unwrap();
    assert!(!session.launched());
    let steps = std::sync::Mutex::new(0);
    let outcome = session.run(&CpuRunner, &|_| *steps.lock().unwrap() += 1).unwrap();
    assert!(outcome.rank_trace.is_none());
    let report = outcome.report.unwrap();
    assert_eq!(*steps.lock().unwrap(), 3);

    let direct = train(
        &session.training,
        session.programs(),
        &session.data,
        &session.opts,
        &|_| {},
    )
    .unwrap();
    let direct_losses: Vec<f64> = direct.steps.iter().map(|s| s.loss).collect();
    assert_eq!(report.losses, direct_losses);
    assert_eq!(report.step_times_s.len(), 3);
    assert_eq!(report.simulated_step_time_s, None);
    let instructions: Vec<usize> = session.programs().iter().map(|p| p.instructions.len()).collect();
    assert_eq!(
        report.per_rank.iter().map(|r| r.instructions).collect::<Vec<_>>(),
        instructions
    );
    assert_eq!(report.per_rank.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(session.tokens_per_step(), 4 * 8);
}

/// With a calibration the report carries the simulated step, and it is
/// the step the simulator finds replaying the session's own programs (the
/// simulator takes them instead of lowering the plan again).
#[test]
fn a_calibrated_session_simulates_its_own_programs() {
    let (graph, plan) = gpt_on_two_ranks();
    let cal = Calibration::default();
    let session = Session::new(plan, graph, 8, options(Some(cal.clone())), LaunchEnv::single()).unwrap();
    let report = session.run(&CpuRunner, &|_| {}).unwrap().report.unwrap();
    let simulated = report.simulated_step_time_s.expect("a simulated step");
    assert!(simulated > 0.0);
    let (relowered, _) = simulate_plan(
        session.plan(),
        &session.training,
        &session.strategy,
        None,
        &cal,
        Precision::F32,
        &SimOptions::default(),
    )
    .unwrap();
    assert_eq!(simulated, relowered.step_time_s);
}

/// Programs that are not the plan's (one per rank) are refused by the
/// simulator instead of replayed.
#[test]
fn the_simulator_refuses_programs_of_another_world() {
    let (graph, plan) = gpt_on_two_ranks();
    let cal = Calibration::default();
    let session = Session::new(plan, graph, 8, options(None), LaunchEnv::single()).unwrap();
    let err = simulate_plan(
        session.plan(),
        &session.training,
        &session.strategy,
        Some(&session.programs()[..1]),
        &cal,
        Precision::F32,
        &SimOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, SimError::Programs { given: 1, world: 2 }), "{err}");
}
