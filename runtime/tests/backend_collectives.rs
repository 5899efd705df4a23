//! A backend that runs all-reduces itself (as the CUDA backend does with
//! NCCL) gets every gradient, tensor-parallel and tied-weight all-reduce of
//! a plan, and the run is bit for bit the run that stages them through
//! host memory. The stand-in backend sums with the same ring over its own
//! fabric, so any difference is the interpreter's routing. It blocks until
//! every member joins, as an NCCL all-reduce holds a GPU's stream, so the
//! runs also show that the plans issue their all-reduces in an order in
//! which no ranks wait on each other in a cycle.

use autopar_ir::{CommKind, Data, Graph, Op, Value};
use autopar_runtime::collective::{fabric, Algorithm, Buffer, Endpoint};
use autopar_runtime::cpu::parallel::{train, train_on, Backend, CpuBackend, TrainOptions, TrainReport};
use autopar_runtime::cpu::Precision;
use autopar_runtime::lower::{for_strategy, lower, Instr, Program, Strategy, TrainingGraph};
use autopar_runtime::train::{initialize, Optimizer, State, TokenSource};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SEQ: usize = 8;
const LAYERS: usize = 4;

/// The reference backend plus all-reduces over a fabric of its own.
struct Summing {
    cpu: CpuBackend,
    endpoint: Endpoint,
    /// Calls so far by group, which also make each call's tag.
    calls: BTreeMap<Vec<usize>, usize>,
    /// Every rank's calls, by group size, for the test to check.
    log: Arc<Mutex<BTreeMap<usize, usize>>>,
}

impl Backend for Summing {
    type Tensor = Arc<Value>;
    type State = State;

    fn upload(&mut self, v: Value) -> Result<Arc<Value>, String> {
        self.cpu.upload(v)
    }
    fn download(&mut self, x: &Arc<Value>) -> Result<Arc<Value>, String> {
        self.cpu.download(x)
    }
    fn bytes(&self, x: &Arc<Value>) -> u64 {
        self.cpu.bytes(x)
    }
    fn numel(&self, x: &Arc<Value>) -> usize {
        self.cpu.numel(x)
    }
    fn eval(&mut self, node: &str, op: &Op, args: &[Option<&Arc<Value>>]) -> Result<Vec<Arc<Value>>, String> {
        self.cpu.eval(node, op, args)
    }
    fn duplicate(&mut self, x: &Arc<Value>) -> Result<Arc<Value>, String> {
        self.cpu.duplicate(x)
    }
    fn accumulate(&mut self, acc: &mut Arc<Value>, g: &Arc<Value>) -> Result<(), String> {
        self.cpu.accumulate(acc, g)
    }
    fn new_state(&mut self, optimizer: &Optimizer, len: usize) -> Result<State, String> {
        self.cpu.new_state(optimizer, len)
    }
    fn update(
        &mut self,
        optimizer: &Optimizer,
        state: &mut State,
        step: u64,
        weight: &mut Arc<Value>,
        w: Range<usize>,
        grad: &Arc<Value>,
        g: Range<usize>,
    ) -> Result<(), String> {
        self.cpu.update(optimizer, state, step, weight, w, grad, g)
    }

    fn all_reduce(&mut self, x: &mut Arc<Value>, group: &[usize]) -> Result<bool, String> {
        let n = self.calls.entry(group.to_vec()).or_insert(0);
        *n += 1;
        let tag = format!("device/{group:?}/{n}");
        *self.log.lock().unwrap().entry(group.len()).or_insert(0) += 1;
        let value = Arc::make_mut(x);
        let mut buffer = match &value.data {
            Data::F32(v) => Buffer::F32(v.clone()),
            Data::F64(v) => Buffer::F64(v.clone()),
            other => return Err(format!("all-reduce of {other:?}")),
        };
        self.endpoint
            .all_reduce(group, &mut buffer, Algorithm::Ring, &tag, "a device all-reduce")
            .map_err(|e| e.to_string())?;
        value.data = match buffer {
            Buffer::F32(v) => Data::F32(v),
            Buffer::F64(v) => Data::F64(v),
        };
        Ok(true)
    }
}

fn lowered(s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    let spec = format!("gpt:layers={LAYERS},hidden=32,heads=4,vocab=64,seq={SEQ}");
    let mut g: Graph = autopar_ir::zoo::build(&spec).unwrap();
    initialize(&mut g, 7).unwrap();
    let t = for_strategy(&g, s, SEQ).unwrap();
    let programs = lower(&t, s).unwrap();
    (t, programs)
}

/// Runs `s` both ways; returns the device all-reduces by group size and
/// the plan's all-reduce instructions of each kind across ranks.
fn check(s: Strategy) -> (BTreeMap<usize, usize>, [usize; 3]) {
    let (t, programs) = lowered(&s);
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-2), 2);
    opts.timeout = Duration::from_secs(20);
    let data = TokenSource::synthetic(64, 3);
    let staged = train(&t, &programs, &data, &opts, &|_| {}).unwrap();
    let endpoints = Mutex::new(
        fabric(programs.len(), opts.timeout)
            .into_iter()
            .map(Some)
            .collect::<Vec<_>>(),
    );
    let log = Arc::new(Mutex::new(BTreeMap::new()));
    let on_device = train_on(&t, &programs, &data, &opts, &|_| {}, &|rank| {
        Ok(Summing {
            cpu: CpuBackend {
                precision: Precision::F32,
            },
            endpoint: endpoints.lock().unwrap()[rank]
                .take()
                .expect("one backend per rank"),
            calls: BTreeMap::new(),
            log: log.clone(),
        })
    })
    .unwrap();
    let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(losses(&on_device), losses(&staged), "losses differ");
    // The all-reduces no longer go through the interpreter's fabric.
    let sent = |r: &TrainReport| r.ranks.iter().map(|r| r.bytes_sent).sum::<u64>();
    assert!(
        sent(&on_device) < sent(&staged),
        "{} vs {}",
        sent(&on_device),
        sent(&staged)
    );
    let mut kinds = [0; 3];
    for instr in programs.iter().flat_map(|p| &p.instructions) {
        match instr {
            Instr::AllReduceGrad { group, .. } if group.len() > 1 => kinds[0] += 1,
            Instr::Collective {
                kind: CommKind::AllReduce,
                group,
                ..
            } if group.len() > 1 => kinds[1] += 1,
            Instr::SumTiedGrads { group, .. } if group.len() > 1 => kinds[2] += 1,
            _ => {}
        }
    }
    let log = log.lock().unwrap().clone();
    (log, kinds)
}

#[test]
fn data_parallel_gradients() {
    let (log, kinds) = check(Strategy::new(2, 1, LAYERS, 1, 2));
    assert!(kinds[0] > 0, "{kinds:?}");
    // Two steps, every rank's call counted.
    assert_eq!(log.get(&2), Some(&(2 * kinds[0])), "{log:?}");
}

#[test]
fn tensor_parallel_activations_and_gradients() {
    let (log, kinds) = check(Strategy::new(1, 1, LAYERS, 1, 2).with_tp(2, false));
    assert!(kinds[1] > 0, "{kinds:?}");
    assert_eq!(
        log.values().sum::<usize>(),
        2 * kinds.iter().sum::<usize>(),
        "{log:?} {kinds:?}"
    );
}

#[test]
fn hybrid_with_a_pipeline() {
    let s = Strategy::new(2, 2, LAYERS, 1, 2).with_tp(2, false);
    let (log, kinds) = check(s);
    assert!(kinds[0] > 0 && kinds[1] > 0, "{kinds:?}");
    assert_eq!(
        log.values().sum::<usize>(),
        2 * kinds.iter().sum::<usize>(),
        "{log:?} {kinds:?}"
    );
}
