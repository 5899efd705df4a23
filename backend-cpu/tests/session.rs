//! A session trains exactly what the rank interpreter trains from the same
//! programs, data and options, and reports every rank; the simulator
//! replays the session's own programs instead of lowering the plan again.

use autopar_comm::launch::LaunchEnv;
use autopar_cost_models::{AttentionKernel, Calibration, Cluster};
use autopar_cpu::{train, CpuRunner};
use autopar_exec::session::{RunOptions, Session};
use autopar_exec::train::Optimizer;
use autopar_ir::interp::Precision;
use autopar_planner::{plan_model, DegreeLimits, ModelId, SearchOptions};
use autopar_sim::{simulate_plan, SimError, SimOptions};
use std::time::Duration;

const SPEC: &str = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8";

/// A session of the zoo GPT on the plan the planner makes for 2 CPU ranks.
fn session() -> Session {
    let graph = autopar_import::zoo::build(SPEC).unwrap();
    let cluster = Cluster::load("cpu").unwrap().with_gpus(2).unwrap();
    let opts = SearchOptions {
        global_batch: 4,
        seq: Some(8),
        max_memory_fraction: 0.9,
        attention: AttentionKernel::Fused,
        dropout: false,
        moe_capacity_factor: None,
        objective: None,
        top: 1,
        tp_comm_overlap: false,
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
    assert_eq!(plan.mesh.ranks.len(), 2);
    let run = RunOptions {
        steps: 3,
        seed: 7,
        optimizer: Optimizer::adamw(1e-3),
        objective: None,
        data: None,
        labels: None,
        precision: Precision::F32,
        overlap: true,
        trace: false,
        rendezvous_wait: Duration::from_secs(5),
        timeout: Duration::from_secs(60),
        save: None,
        resume: None,
        threads_per_rank: None,
    };
    Session::new(plan, graph, 8, run, LaunchEnv::single()).unwrap()
}

#[test]
fn a_session_trains_what_the_interpreter_trains() {
    let session = session();
    assert!(!session.launched());
    let steps = std::sync::Mutex::new(0);
    let outcome = session.run(&CpuRunner, &|_| *steps.lock().unwrap() += 1).unwrap();
    assert!(outcome.rank_trace.is_none());
    let report = outcome.report.unwrap();
    assert_eq!(*steps.lock().unwrap(), 3);

    let direct = train(
        session.training(),
        session.programs(),
        session.data(),
        session.train_options(),
        &|_| {},
    )
    .unwrap();
    let direct_losses: Vec<f64> = direct.steps.iter().map(|s| s.loss).collect();
    assert_eq!(report.losses, direct_losses);
    assert_eq!(report.step_times_s.len(), 3);
    let instructions: Vec<usize> = session.programs().iter().map(|p| p.instructions.len()).collect();
    assert_eq!(
        report.per_rank.iter().map(|r| r.instructions).collect::<Vec<_>>(),
        instructions
    );
    assert_eq!(report.per_rank.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(session.tokens_per_step(), 4 * 8);
}

/// Replaying the session's programs gives the step the simulator finds
/// lowering the plan itself.
#[test]
fn the_simulator_replays_the_sessions_programs() {
    let session = session();
    let cal = Calibration::default();
    let simulate = |programs| {
        simulate_plan(
            session.plan(),
            session.training(),
            session.strategy(),
            programs,
            &cal,
            Precision::F32,
            &SimOptions::default(),
        )
    };
    let (given, _) = simulate(Some(session.programs())).unwrap();
    let (relowered, _) = simulate(None).unwrap();
    assert!(given.step_time_s > 0.0);
    assert_eq!(given.step_time_s, relowered.step_time_s);
    let err = simulate(Some(&session.programs()[..1])).unwrap_err();
    assert!(matches!(err, SimError::Programs { given: 1, world: 2 }), "{err}");
}
