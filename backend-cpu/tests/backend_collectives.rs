//! A backend that runs all-reduces itself (as the CUDA backend does with
//! NCCL) gets every gradient, tensor-parallel and tied-weight all-reduce of
//! a plan, and the run is bit for bit the run that stages them through
//! host memory. The stand-in backend sums with the same ring over its own
//! fabric, so any difference is the interpreter's routing. It blocks until
//! every member joins, as an NCCL all-reduce holds a GPU's stream, so the
//! runs also show that the plans issue their all-reduces in an order in
//! which no ranks wait on each other in a cycle.
//!
//! Gradient reductions and ZeRO's weight refresh come [`Order::Overlapped`]
//! (a GPU runs them on a stream of their own until the interpreter joins
//! it); the stand-in fails any touch of a tensor they read or wrote before
//! that join, so the runs also show the interpreter joins before every use.

use autopar_comm::collective::{fabric, Algorithm, Buffer, Endpoint};
use autopar_cost_models::Schedule;
use autopar_cpu::{train, CpuBackend};
use autopar_exec::buckets;
use autopar_exec::train::{initialize, Optimizer, State, TokenSource};
use autopar_exec::{train_on, Backend, BackendError, DeviceCollectives, Order, TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::{CommKind, DType, Data, Graph, Op, Value};
use autopar_lower::blocking::{check_blocking, Transfers};
use autopar_lower::{for_strategy, lower, Instr, Objective, Program, Strategy, TrainingGraph};
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
    /// Every rank's calls, by kind, for the test to check.
    log: Arc<Mutex<BTreeMap<Kind, usize>>>,
    /// Sends of the open group, waiting for their receivers: (rank, tag).
    unconfirmed: Vec<(usize, String)>,
    /// Whether sends wait for their receivers at the end of their group
    /// (NCCL's grouped transfers) or not at all (per-pair transfers on
    /// streams of their own); chosen as the CUDA backend chooses.
    grouped: bool,
    /// What overlapped collectives read or wrote since the last join.
    in_flight: Vec<Arc<Value>>,
}

impl Backend for Summing {
    type Tensor = Arc<Value>;
    type State = State;

    fn upload(&mut self, v: Value) -> Result<Arc<Value>, BackendError> {
        self.cpu.upload(v)
    }
    fn download(&mut self, x: &Arc<Value>) -> Result<Arc<Value>, BackendError> {
        self.untouched(&[x])?;
        self.cpu.download(x)
    }
    fn bytes(&self, x: &Arc<Value>) -> u64 {
        self.cpu.bytes(x)
    }
    fn numel(&self, x: &Arc<Value>) -> usize {
        self.cpu.numel(x)
    }
    fn eval(
        &mut self,
        node: &str,
        op: &Op,
        args: &[Option<&Arc<Value>>],
    ) -> Result<Vec<Arc<Value>>, BackendError> {
        self.untouched(&args.iter().flatten().copied().collect::<Vec<_>>())?;
        self.cpu.eval(node, op, args)
    }
    fn duplicate(&mut self, x: &Arc<Value>) -> Result<Arc<Value>, BackendError> {
        self.untouched(&[x])?;
        self.cpu.duplicate(x)
    }
    fn accumulate(&mut self, acc: &mut Arc<Value>, g: &Arc<Value>) -> Result<(), BackendError> {
        self.untouched(&[acc, g])?;
        self.cpu.accumulate(acc, g)
    }
    fn new_state(&mut self, optimizer: &Optimizer, len: usize) -> Result<State, BackendError> {
        self.cpu.new_state(optimizer, len)
    }
    fn save_state(&mut self, state: &State) -> Result<Vec<Value>, BackendError> {
        self.cpu.save_state(state)
    }
    fn load_state(&mut self, optimizer: &Optimizer, slots: &[Value]) -> Result<State, BackendError> {
        self.cpu.load_state(optimizer, slots)
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
    ) -> Result<(), BackendError> {
        self.untouched(&[weight, grad])?;
        self.cpu.update(optimizer, state, step, weight, w, grad, g)
    }

    fn device_comms(&mut self) -> Option<&mut dyn DeviceCollectives<Arc<Value>>> {
        Some(self)
    }
}

impl DeviceCollectives<Arc<Value>> for Summing {
    fn all_reduce(
        &mut self,
        x: &mut Arc<Value>,
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        self.untouched(&[x])?;
        let tag = self.next_tag(Kind::AllReduce, group);
        let mut buffer = flat(x, x.numel())?;
        self.endpoint
            .all_reduce(group, &mut buffer, Algorithm::Ring, &tag, "a device all-reduce")
            .map_err(|e| e.to_string())?;
        *x = Arc::new(shaped(buffer, x.dtype, &x.shape));
        self.hold(order, [x.clone()]);
        Ok(true)
    }

    fn reduce_scatter(
        &mut self,
        x: &Arc<Value>,
        group: &[usize],
        order: Order,
    ) -> Result<Option<Arc<Value>>, BackendError> {
        self.untouched(&[x])?;
        let tag = self.next_tag(Kind::ReduceScatter, group);
        let part = x.numel().div_ceil(group.len());
        let mine = self
            .endpoint
            .reduce_scatter(
                group,
                &flat(x, part * group.len())?,
                &tag,
                "a device reduce-scatter",
            )
            .map_err(|e| e.to_string())?;
        let mine = Arc::new(shaped(mine, x.dtype, &[part]));
        self.hold(order, [x.clone(), mine.clone()]);
        Ok(Some(mine))
    }

    /// One ring over the bucket laid out as the interpreter lays it out.
    fn all_reduce_bucket(
        &mut self,
        xs: &mut [Arc<Value>],
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        self.untouched(&xs.iter().collect::<Vec<_>>())?;
        let tag = self.next_tag(Kind::AllReduce, group);
        let values: Vec<Value> = xs.iter().map(|x| (**x).clone()).collect();
        let shapes: Vec<Vec<usize>> = values.iter().map(|v| v.shape.clone()).collect();
        let mut buffer = buckets::concat(values).map_err(|e| e.to_string())?;
        self.endpoint
            .all_reduce(
                group,
                &mut buffer,
                Algorithm::Ring,
                &tag,
                "a device bucket all-reduce",
            )
            .map_err(|e| e.to_string())?;
        let sums = buckets::split(buffer, xs[0].dtype, &shapes).map_err(|e| e.to_string())?;
        for (x, sum) in xs.iter_mut().zip(sums) {
            *x = Arc::new(sum);
        }
        self.hold(order, xs.iter().cloned());
        Ok(true)
    }

    fn reduce_scatter_bucket(
        &mut self,
        xs: &[Arc<Value>],
        group: &[usize],
        order: Order,
    ) -> Result<Option<Vec<Arc<Value>>>, BackendError> {
        self.untouched(&xs.iter().collect::<Vec<_>>())?;
        let tag = self.next_tag(Kind::ReduceScatter, group);
        let n = group.len();
        let values: Vec<Value> = xs.iter().map(|x| (**x).clone()).collect();
        let parts: Vec<Vec<usize>> = values.iter().map(|v| vec![v.numel().div_ceil(n)]).collect();
        let flat = buckets::interleave(values, n).map_err(|e| e.to_string())?;
        let mine = self
            .endpoint
            .reduce_scatter(group, &flat, &tag, "a device bucket reduce-scatter")
            .map_err(|e| e.to_string())?;
        let mine = buckets::split(mine, xs[0].dtype, &parts).map_err(|e| e.to_string())?;
        let mine: Vec<Arc<Value>> = mine.into_iter().map(Arc::new).collect();
        self.hold(order, xs.iter().chain(&mine).cloned());
        Ok(Some(mine))
    }

    fn all_gather(
        &mut self,
        part: &Arc<Value>,
        group: &[usize],
        shape: &[usize],
        order: Order,
    ) -> Result<Option<Arc<Value>>, BackendError> {
        self.untouched(&[part])?;
        let tag = self.next_tag(Kind::AllGather, group);
        let all = self
            .endpoint
            .all_gather(group, &flat(part, part.numel())?, &tag, "a device all-gather")
            .map_err(|e| e.to_string())?;
        let all = Arc::new(shaped(all, part.dtype, shape));
        self.hold(order, [part.clone(), all.clone()]);
        Ok(Some(all))
    }

    fn all_gather_parts(
        &mut self,
        w: &mut Arc<Value>,
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        self.untouched(&[w])?;
        let tag = self.next_tag(Kind::AllGather, group);
        let position = group.iter().position(|&r| r == self.endpoint.rank()).unwrap();
        let part = w.numel().div_ceil(group.len());
        let mine = match flat(w, part * group.len())? {
            Buffer::F32(v) => Buffer::F32(v[position * part..][..part].to_vec()),
            Buffer::F64(v) => Buffer::F64(v[position * part..][..part].to_vec()),
        };
        let all = self
            .endpoint
            .all_gather(group, &mine, &tag, "a device all-gather")
            .map_err(|e| e.to_string())?;
        *w = Arc::new(shaped(all, w.dtype, &w.shape));
        self.hold(order, [w.clone()]);
        Ok(true)
    }

    fn gather_along(
        &mut self,
        x: &Arc<Value>,
        group: &[usize],
        axis: usize,
    ) -> Result<Option<Arc<Value>>, BackendError> {
        self.untouched(&[x])?;
        // As NCCL here, floats only: expert indices go through the host.
        if !x.dtype.is_float() {
            return Ok(None);
        }
        let tag = self.next_tag(Kind::AllGather, group);
        let stacked = self
            .endpoint
            .all_gather(group, &flat(x, x.numel())?, &tag, "a device gather")
            .map_err(|e| e.to_string())?;
        let parts = group.len();
        let mut shape = x.shape.clone();
        shape[axis] *= parts;
        let joined = permuted(&stacked, &concatenation_order(&x.shape, axis, parts));
        Ok(Some(Arc::new(shaped(joined, x.dtype, &shape))))
    }

    fn reduce_scatter_along(
        &mut self,
        x: &Arc<Value>,
        group: &[usize],
        axis: usize,
    ) -> Result<Option<Arc<Value>>, BackendError> {
        self.untouched(&[x])?;
        if !x.dtype.is_float() {
            return Ok(None);
        }
        let tag = self.next_tag(Kind::ReduceScatter, group);
        let parts = group.len();
        let mut piece = x.shape.clone();
        piece[axis] /= parts;
        // Slice p of x is element block p of the concatenation of slices.
        let order = concatenation_order(&piece, axis, parts);
        let mut stacking = vec![0; order.len()];
        for (at, &from) in order.iter().enumerate() {
            stacking[from] = at;
        }
        let stacked = permuted(&flat(x, x.numel())?, &stacking);
        let mine = self
            .endpoint
            .reduce_scatter(group, &stacked, &tag, "a device reduce-scatter")
            .map_err(|e| e.to_string())?;
        Ok(Some(Arc::new(shaped(mine, x.dtype, &piece))))
    }

    fn join(&mut self) -> Result<(), BackendError> {
        self.in_flight.clear();
        Ok(())
    }

    fn send(&mut self, x: &Arc<Value>, to: usize) -> Result<bool, BackendError> {
        self.untouched(&[x])?;
        let tag = self.next_tag(Kind::Send, &[self.endpoint.rank(), to]);
        self.endpoint
            .send(to, &tag, flat(x, x.numel())?, "a device send")
            .map_err(|e| e.to_string())?;
        if self.grouped {
            self.unconfirmed.push((to, format!("{tag}/posted")));
        }
        Ok(true)
    }

    fn recv(
        &mut self,
        from: usize,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Option<Arc<Value>>, BackendError> {
        let tag = self.next_tag(Kind::Recv, &[from, self.endpoint.rank()]);
        let ep = &self.endpoint;
        let got = ep
            .recv(from, &tag, "a device receive")
            .map_err(|e| e.to_string())?;
        if self.grouped {
            ep.send(
                from,
                &format!("{tag}/posted"),
                Buffer::F32(Vec::new()),
                "a receipt",
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(Some(Arc::new(shaped(got, dtype, shape))))
    }

    fn bytes_sent(&self) -> u64 {
        self.endpoint.bytes_sent()
    }

    /// A group's sends complete when their receivers have posted, as an
    /// NCCL group's do.
    fn flush_transfers(&mut self) -> Result<(), BackendError> {
        for (to, tag) in std::mem::take(&mut self.unconfirmed) {
            self.endpoint
                .recv(to, &tag, "a send's receipt")
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// What the stand-in backend ran, for the test to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Send,
    Recv,
    /// Calls of the kinds above issued [`Order::Overlapped`].
    Overlapped,
}

impl Summing {
    /// Fails if an overlapped collective not yet joined reads or writes
    /// any of `xs`: on a GPU that touch would race with it.
    fn untouched(&self, xs: &[&Arc<Value>]) -> Result<(), BackendError> {
        match xs
            .iter()
            .any(|x| self.in_flight.iter().any(|held| Arc::ptr_eq(held, x)))
        {
            true => Err(BackendError::Device(
                "touched a tensor of an overlapped collective before joining it".into(),
            )),
            false => Ok(()),
        }
    }

    /// Marks `tensors` as an overlapped collective's until the next join,
    /// counting the call.
    fn hold(&mut self, order: Order, tensors: impl IntoIterator<Item = Arc<Value>>) {
        if order == Order::Overlapped {
            self.in_flight.extend(tensors);
            *self.log.lock().unwrap().entry(Kind::Overlapped).or_insert(0) += 1;
        }
    }

    /// Counts a call and names it uniquely (members call alike, in order).
    fn next_tag(&mut self, kind: Kind, group: &[usize]) -> String {
        let n = self.calls.entry(group.to_vec()).or_insert(0);
        *n += 1;
        *self.log.lock().unwrap().entry(kind).or_insert(0) += 1;
        format!("device/{group:?}/{n}")
    }
}

/// `v`'s floats, zero-padded to `len`.
fn flat(v: &Value, len: usize) -> Result<Buffer, BackendError> {
    Ok(match &v.data {
        Data::F32(x) => Buffer::F32(
            x.iter()
                .copied()
                .chain(std::iter::repeat(0.0))
                .take(len)
                .collect(),
        ),
        Data::F64(x) => Buffer::F64(
            x.iter()
                .copied()
                .chain(std::iter::repeat(0.0))
                .take(len)
                .collect(),
        ),
        other => return Err(BackendError::Collective(format!("a collective on {other:?}"))),
    })
}

/// Where each element of the concatenation along `axis` of `parts`
/// row-major `piece`s lies when the pieces are stacked one after another.
fn concatenation_order(piece: &[usize], axis: usize, parts: usize) -> Vec<usize> {
    let outer: usize = piece[..axis].iter().product();
    let row: usize = piece[axis..].iter().product();
    (0..outer)
        .flat_map(|o| (0..parts).flat_map(move |p| (p * outer + o) * row..(p * outer + o + 1) * row))
        .collect()
}

/// `b[order[i]]` for each `i`.
fn permuted(b: &Buffer, order: &[usize]) -> Buffer {
    match b {
        Buffer::F32(x) => Buffer::F32(order.iter().map(|&i| x[i]).collect()),
        Buffer::F64(x) => Buffer::F64(order.iter().map(|&i| x[i]).collect()),
    }
}

/// The first elements of `b` as a `dtype` value of `shape`.
fn shaped(b: Buffer, dtype: DType, shape: &[usize]) -> Value {
    let n = shape.iter().product();
    let data = match b {
        Buffer::F32(mut x) => {
            x.truncate(n);
            Data::F32(x)
        }
        Buffer::F64(mut x) => {
            x.truncate(n);
            Data::F64(x)
        }
    };
    Value::new(dtype, shape.to_vec(), data).unwrap()
}

fn lowered(s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    lowered_model(
        &format!("gpt:layers={LAYERS},hidden=32,heads=4,vocab=64,seq={SEQ}"),
        s,
    )
}

fn lowered_model(spec: &str, s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    let mut g: Graph = autopar_import::zoo::build(spec).unwrap();
    initialize(&mut g, 7).unwrap();
    let t = for_strategy(&g, s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, s).unwrap();
    (t, programs)
}

/// Runs `s` through the stand-in, two steps, with overlap on or off.
fn on_device(
    t: &TrainingGraph,
    programs: &[Program],
    opts: &TrainOptions,
) -> (TrainReport, BTreeMap<Kind, usize>) {
    let endpoints = Mutex::new(
        fabric(programs.len(), opts.timeout)
            .into_iter()
            .map(Some)
            .collect::<Vec<_>>(),
    );
    let log = Arc::new(Mutex::new(BTreeMap::new()));
    let data = autopar_exec::train::Data::from(TokenSource::synthetic(64, 3));
    let report = train_on(t, programs, &data, opts, &|_| {}, &|rank| {
        Ok(Summing {
            cpu: CpuBackend {
                precision: Precision::F32,
            },
            endpoint: endpoints.lock().unwrap()[rank]
                .take()
                .expect("one backend per rank"),
            calls: BTreeMap::new(),
            log: log.clone(),
            unconfirmed: Vec::new(),
            grouped: check_blocking(programs, Transfers::Grouped).is_ok(),
            in_flight: Vec::new(),
        })
    })
    .unwrap();
    let log = log.lock().unwrap().clone();
    (report, log)
}

/// Runs `s` host-staged and through the stand-in (two steps, with overlap
/// on and off) and checks that the stand-in ran each of the plan's
/// all-reduces, reduce-scatters and gathers once a step, the gradient
/// reductions and weight refreshes overlapped when overlap is on; returns
/// how many of each kind the plan has, over all ranks.
fn check(s: Strategy) -> BTreeMap<Kind, usize> {
    let (t, programs) = lowered(&s);
    check_lowered(&t, &programs)
}

fn check_lowered(t: &TrainingGraph, programs: &[Program]) -> BTreeMap<Kind, usize> {
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-2), 2);
    opts.timeout = Duration::from_secs(20);
    let data = autopar_exec::train::Data::from(TokenSource::synthetic(64, 3));
    let staged = train(t, programs, &data, &opts, &|_| {}).unwrap();
    let mut planned = BTreeMap::new();
    let mut overlappable = 0;
    let g = &t.graph;
    let floats: BTreeMap<&str, bool> = g
        .node_indices()
        .map(|i| {
            let input = g.node(i).inputs.first().copied().flatten();
            let float = input.is_some_and(|x| g.tensor(x).ty.dtype.is_float());
            (g.node(i).name.as_str(), float)
        })
        .collect();
    for instr in programs.iter().flat_map(|p| &p.instructions) {
        let kind = match instr {
            // Integer tensors (expert counts) and the data-dependent
            // all-to-alls stay host-staged.
            Instr::Collective { node, .. } if !floats[node.as_str()] => continue,
            Instr::Collective {
                kind: CommKind::AllToAll | CommKind::Dispatch | CommKind::Combine,
                ..
            } => continue,
            Instr::AllReduceGrad { .. }
            | Instr::Collective {
                kind: CommKind::AllReduce,
                ..
            } => Kind::AllReduce,
            Instr::Collective {
                kind: CommKind::AllGather | CommKind::GatherForCompute,
                ..
            } => Kind::AllGather,
            Instr::Collective {
                kind: CommKind::ReduceScatter,
                ..
            } => Kind::ReduceScatter,
            Instr::SumTiedGrads { group, .. } if group.len() > 1 => Kind::AllReduce,
            Instr::ReduceScatterGrad { .. } => Kind::ReduceScatter,
            Instr::AllGatherParams { .. } | Instr::GatherParam { .. } => Kind::AllGather,
            Instr::Send { .. } | Instr::SendParam { .. } => Kind::Send,
            Instr::Recv { .. } | Instr::RecvParam { .. } => Kind::Recv,
            _ => continue,
        };
        // A backend gathers a refresh bucket weight by weight.
        let calls = match instr {
            Instr::AllGatherParams { params, .. } => params.len(),
            _ => 1,
        };
        *planned.entry(kind).or_insert(0) += calls;
        if instr.overlaps_compute() {
            overlappable += calls;
        }
    }
    for overlap in [true, false] {
        opts.overlap_comm = overlap;
        let (routed, log) = on_device(t, programs, &opts);
        let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            losses(&routed),
            losses(&staged),
            "overlap {overlap}: losses differ"
        );
        // The backend's traffic is reported as the fabric's was.
        let sent = |r: &TrainReport| r.ranks.iter().map(|r| r.bytes_sent).collect::<Vec<_>>();
        assert_eq!(sent(&routed), sent(&staged));
        let mut twice: BTreeMap<Kind, usize> = planned.iter().map(|(k, n)| (*k, 2 * n)).collect();
        if overlap && overlappable > 0 {
            twice.insert(Kind::Overlapped, 2 * overlappable);
        }
        assert_eq!(log, twice, "overlap {overlap}");
    }
    planned
}

#[test]
fn data_parallel_gradients() {
    let planned = check(Strategy::new(2, 1, LAYERS, 1, 2));
    assert_eq!(planned.keys().collect::<Vec<_>>(), [&Kind::AllReduce]);
}

#[test]
fn tensor_parallel_activations_and_gradients() {
    let planned = check(Strategy::new(1, 1, LAYERS, 1, 2).with_tp(2, false));
    assert!(planned.contains_key(&Kind::AllReduce), "{planned:?}");
}

#[test]
fn hybrid_with_a_pipeline_and_tied_embeddings() {
    let planned = check(Strategy::new(2, 2, LAYERS, 1, 2).with_tp(2, false));
    assert!(planned.contains_key(&Kind::AllReduce), "{planned:?}");
}

#[test]
fn pipelines() {
    for schedule in [Schedule::OneFOneB, Schedule::Gpipe] {
        let mut s = Strategy::new(1, 2, LAYERS, 1, 4);
        s.schedule = schedule;
        let planned = check(s);
        assert!(planned.contains_key(&Kind::Send), "{schedule:?}: {planned:?}");
    }
    let planned = check(Strategy::new(1, 4, LAYERS, 1, 8));
    assert!(planned.contains_key(&Kind::Recv), "{planned:?}");
    // Posted as groups, the interleaved schedule's transfers can wait in a
    // cycle (whether they do depends on what runs between them): its sends
    // go per pair and never wait, and it runs whole either way.
    let mut cycles = 0;
    for (pp, micro_batches) in [(2, 4), (2, 8), (4, 8)] {
        let mut s = Strategy::new(1, pp, LAYERS, 1, micro_batches);
        s.schedule = Schedule::Interleaved;
        s.chunks = 2;
        let (_, programs) = lowered(&s);
        if let Err(err) = check_blocking(&programs, Transfers::Grouped) {
            assert!(
                err.to_string()
                    .starts_with("ranks wait on each other: rank 0 at "),
                "pp {pp}, {micro_batches} micro-batches: {err}"
            );
            cycles += 1;
        }
        let planned = check(s);
        assert!(planned.contains_key(&Kind::Send), "{planned:?}");
    }
    assert!(cycles > 0, "no interleaved schedule waited in a cycle as groups");
}

/// Sequence parallelism's gathers and reduce-scatters along an axis go to
/// the backend with everything else, in a plan that has every kind.
#[test]
fn sequence_parallel_gathers_in_a_hybrid_plan() {
    let mut s = Strategy::new(2, 2, LAYERS, 1, 2).with_tp(2, true);
    s.zero = 3;
    let (_, programs) = lowered(&s);
    let along_axis = programs.iter().flat_map(|p| &p.instructions).any(|i| {
        matches!(
            i,
            Instr::Collective {
                kind: CommKind::GatherForCompute,
                ..
            }
        )
    });
    assert!(along_axis, "the plan gathers along the sequence");
    let planned = check(s);
    for kind in [Kind::AllReduce, Kind::ReduceScatter, Kind::AllGather, Kind::Send] {
        assert!(planned.contains_key(&kind), "{kind:?}: {planned:?}");
    }
}

/// Context parallelism gathers keys and values along the sequence.
#[test]
fn context_parallel_gathers() {
    let mut s = Strategy::new(2, 1, LAYERS, 1, 2).with_cp(2);
    s.zero = 1;
    let planned = check(s);
    for kind in [Kind::AllReduce, Kind::AllGather, Kind::ReduceScatter] {
        assert!(planned.contains_key(&kind), "{kind:?}: {planned:?}");
    }
}

/// Expert parallelism dispatches tokens and combines the experts' outputs
/// all-to-all on the host collectives (data-dependent sizes), forward and
/// backward in every layer; the backend runs only the gradients' reductions.
#[test]
fn expert_parallel_token_exchange() {
    let spec = format!("moe:layers=2,hidden=32,ffn=48,heads=4,experts=4,top_k=2,vocab=64,seq={SEQ}");
    let mut s = Strategy::new(2, 1, 2, 1, 2);
    s.ep = 2;
    let (t, programs) = lowered_model(&spec, &s);
    let planned = check_lowered(&t, &programs);
    assert_eq!(planned.keys().collect::<Vec<_>>(), [&Kind::AllReduce]);
    let exchanges = programs[0]
        .instructions
        .iter()
        .filter(|i| {
            matches!(
                i,
                Instr::Collective {
                    kind: CommKind::Dispatch | CommKind::Combine,
                    ..
                }
            )
        })
        .count();
    // Two layers, two micro-batches: a dispatch and a combine each way.
    assert_eq!(exchanges, 2 * 2 * 4);
}

#[test]
fn zero_stages() {
    for zero in 1..=3 {
        let mut s = Strategy::new(2, 1, LAYERS, 1, 2);
        s.zero = zero;
        let planned = check(s);
        let gathers = planned.get(&Kind::AllGather).copied().unwrap_or(0);
        assert!(gathers > 0, "zero {zero}: {planned:?}");
        assert!(
            planned.contains_key(&Kind::ReduceScatter),
            "zero {zero}: {planned:?}"
        );
    }
}
