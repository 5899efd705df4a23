//! Buffer placement: before a step runs, every transient buffer of a rank's
//! [`Program`] — each micro-batch's activations and gradients, received
//! tensors, ZeRO-3 gathered weights — gets an offset in one device arena.
//!
//! Why: `cudaMalloc` and `cudaFree` synchronise the device and cost tens of
//! microseconds each, and allocating buffer by buffer fragments memory, so a
//! step can run out with enough bytes free in pieces. A planned arena is one
//! allocation, reused every step, and its size — the step's peak — is known
//! before anything runs, to check against the device and the cost model.
//!
//! A buffer lives from the instruction that writes it to its `Free` (to the
//! end of the program if none frees it); buffers whose lifetimes do not
//! overlap share addresses. Placement is greedy, each buffer at the lowest
//! offset clear of the already placed ones alive with it, in three orders
//! (largest first, largest size × lifetime first, the peak's buffers
//! first), keeping the smallest arena. On the zoo GPTs' programs the arena
//! is at most 14 % above the bytes alive at the peak, which no placement
//! can beat (0-1 % without a pipeline; the first stages of 1F1B, whose
//! micro-batches' lifetimes interleave, are the worst).
//!
//! Weights, gradient accumulators and optimizer state stay in memory for
//! the whole step and are not in the arena; [`ModelState`] counts them.

use autopar_cost_models::memory::optimizer_bytes_per_param;
use autopar_ir::{DType, Graph, NodeIndex, TensorId};
use autopar_lower::program::BufferUse;
use autopar_lower::program::{operands, Operand};
use autopar_lower::{Buf, Instr, Program, TrainingGraph};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound::{Excluded, Included};

mod error;
pub use error::{BufferError, MemoryError, PlacementError};

/// Every offset and every buffer's extent is a multiple of this (cudaMalloc
/// aligns to 256 bytes, and vectorised kernels need at least 16).
pub const ALIGNMENT: u64 = 256;

/// The element type buffers are planned in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ElementSize {
    /// Each tensor's type in the training graph.
    #[default]
    AsGraph,
    /// Float tensors in this type (bf16 activations on a GPU); integer and
    /// boolean tensors (token ids, masks) keep their graph type.
    Float(DType),
}

impl ElementSize {
    fn dtype(self, graph: DType) -> DType {
        match self {
            ElementSize::Float(d) if graph.is_float() => d,
            _ => graph,
        }
    }
}

/// One lifetime of one buffer and its place in the arena. A buffer that is
/// freed and written again (a recomputation) has one block per lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub buf: Buf,
    /// The instruction writing the buffer and the last one it exists
    /// during (its `Free`, or the program's last), inclusive.
    pub first: usize,
    pub last: usize,
    /// The tensor's bytes.
    pub bytes: u64,
    /// Where it starts in the arena (a multiple of [`ALIGNMENT`]).
    pub offset: u64,
}

impl Block {
    /// Bytes the block takes in the arena: its own, rounded up to [`ALIGNMENT`].
    pub fn extent(&self) -> u64 {
        self.bytes.div_ceil(ALIGNMENT) * ALIGNMENT
    }
}

/// `x@mb0 (instructions 3..=7, bytes 512..1024)`, as errors name a block.
impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (first, last, offset) = (self.first, self.last, self.offset);
        let end = offset + self.extent();
        write!(
            f,
            "{} (instructions {first}..={last}, bytes {offset}..{end})",
            self.buf
        )
    }
}

/// What a rank keeps outside the arena for the whole step, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelState {
    /// The weights it stores (a shard of each under ZeRO-3).
    pub weights: u64,
    /// A gradient accumulator per parameter: whole where the program adds
    /// every micro-batch's gradient before one reduction (ZeRO-0/1, and
    /// what reduces after the pipeline), a shard where it reduce-scatters
    /// each micro-batch's gradient and adds the shards (ZeRO-2/3).
    pub gradients: u64,
    /// Adam state (moments, and an f32 master copy of narrower weights) of
    /// what its optimizer steps update (a shard under ZeRO-1 and above).
    pub optimizer: u64,
}

impl ModelState {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.weights + self.gradients + self.optimizer
    }
}

/// Where every transient buffer of one rank's program lives, and the sizes
/// that follow.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    pub rank: usize,
    /// Every buffer lifetime, in the order the program creates them.
    pub blocks: Vec<Block>,
    /// Bytes of the arena: the highest end of any block.
    pub arena_bytes: u64,
    /// Largest sum of block extents alive at one instruction: no placement
    /// fits in a smaller arena.
    pub peak_live_bytes: u64,
    /// The first instruction at which `peak_live_bytes` are alive.
    pub peak_at: usize,
    /// Largest sum of micro-batch buffers' bytes (unaligned) alive at one
    /// instruction: what the CPU interpreter measures and the cost model's
    /// activation memory estimates.
    pub peak_activation_bytes: u64,
    /// Bytes outside the arena.
    pub persistent: ModelState,
    /// Each buffer's blocks, in program order.
    by_buf: HashMap<Buf, Vec<usize>>,
}

impl MemoryPlan {
    /// The offset of `buf` as instruction `at` sees it, if it is alive there.
    pub fn offset(&self, buf: &Buf, at: usize) -> Option<u64> {
        self.by_buf
            .get(buf)?
            .iter()
            .map(|&i| &self.blocks[i])
            .find(|b| b.first <= at && at <= b.last)
            .map(|b| b.offset)
    }

    /// Arena bytes over the lower bound (1.0: no placement does better).
    pub fn overhead(&self) -> f64 {
        self.arena_bytes as f64 / self.peak_live_bytes.max(1) as f64
    }

    fn new(rank: usize, blocks: Vec<Block>, instructions: usize, persistent: ModelState) -> MemoryPlan {
        let (peak_live_bytes, peak_at) = peak(&blocks, instructions, Block::extent);
        let activation = |b: &Block| if b.buf.micro_batch.is_some() { b.bytes } else { 0 };
        let mut by_buf: HashMap<Buf, Vec<usize>> = HashMap::new();
        for (i, b) in blocks.iter().enumerate() {
            by_buf.entry(b.buf.clone()).or_default().push(i);
        }
        MemoryPlan {
            rank,
            arena_bytes: blocks.iter().map(|b| b.offset + b.extent()).max().unwrap_or(0),
            peak_live_bytes,
            peak_at,
            peak_activation_bytes: peak(&blocks, instructions, activation).0,
            persistent,
            blocks,
            by_buf,
        }
    }
}

/// Plans the arena of `program`, one rank's step of `t`, with buffers sized
/// by `size`.
pub fn plan_memory(
    t: &TrainingGraph,
    program: &Program,
    size: ElementSize,
) -> Result<MemoryPlan, MemoryError> {
    let g = &t.graph;
    let mut life = Lifetimes {
        g,
        size,
        tensors: g.tensors().map(|(id, x)| (x.name.as_str(), id)).collect(),
        nodes: g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect(),
        gradients: t
            .gradients
            .iter()
            .map(|(p, gr)| (p.as_str(), gr.as_str()))
            .collect(),
        blocks: Vec::new(),
        live: HashMap::new(),
    };
    for (index, instr) in program.instructions.iter().enumerate() {
        life.instr(index, instr)
            .map_err(|source| MemoryError::Instruction {
                rank: program.rank,
                index,
                what: instr.describe(),
                source,
            })?;
    }
    let end = program.instructions.len().saturating_sub(1);
    for (_, b) in life.live.drain() {
        life.blocks[b].last = end;
    }
    let persistent = model_state(&life, program)?;
    let mut blocks = life.blocks;
    let lifetimes: Vec<(usize, usize, u64)> = blocks.iter().map(|b| (b.first, b.last, b.extent())).collect();
    for (b, offset) in blocks.iter_mut().zip(place(&lifetimes)) {
        b.offset = offset;
    }
    Ok(MemoryPlan::new(
        program.rank,
        blocks,
        program.instructions.len(),
        persistent,
    ))
}

/// Checks that no two blocks alive at the same instruction share a byte,
/// and that every block is aligned and inside the arena: a sweep over the
/// instructions keeping the live blocks ordered by offset.
pub fn check(plan: &MemoryPlan) -> Result<(), PlacementError> {
    let blocks = &plan.blocks;
    // (instruction, 0: leaves before it / 1: arrives at it, block)
    let mut events = Vec::with_capacity(2 * blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        if b.offset % ALIGNMENT != 0 || b.offset + b.extent() > plan.arena_bytes || b.first > b.last {
            return Err(PlacementError::Misplaced {
                block: Box::new(b.clone()),
                arena_bytes: plan.arena_bytes,
            });
        }
        if b.extent() > 0 {
            events.push((b.first, 1, i));
            events.push((b.last + 1, 0, i));
        }
    }
    events.sort_unstable();
    // The live blocks by offset; they never overlap, so a new block can
    // only collide with the highest one starting below its end.
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, arrives, i) in events {
        let b = &blocks[i];
        if arrives == 0 {
            live.remove(&b.offset);
            continue;
        }
        if let Some((_, &j)) = live.range(..b.offset + b.extent()).next_back() {
            let other = &blocks[j];
            if other.offset + other.extent() > b.offset {
                return Err(PlacementError::Overlap {
                    block: Box::new(b.clone()),
                    other: Box::new(other.clone()),
                });
            }
        }
        live.insert(b.offset, i);
    }
    Ok(())
}

/// The buffers of a program as its instructions create, read and free them.
struct Lifetimes<'t> {
    g: &'t Graph,
    size: ElementSize,
    tensors: HashMap<&'t str, TensorId>,
    nodes: HashMap<&'t str, NodeIndex>,
    /// Gradient tensor of each parameter.
    gradients: HashMap<&'t str, &'t str>,
    blocks: Vec<Block>,
    /// The block of each live buffer.
    live: HashMap<Buf, usize>,
}

impl Lifetimes<'_> {
    /// Elements and planned type of `tensor`.
    fn tensor(&self, tensor: &str) -> Result<(u64, DType), BufferError> {
        let id = self
            .tensors
            .get(tensor)
            .ok_or_else(|| BufferError::NoTensor(tensor.to_string()))?;
        let ty = &self.g.tensor(*id).ty;
        let numel = ty
            .shape
            .numel(&self.g.bindings)
            .ok_or_else(|| BufferError::UnboundDims(tensor.to_string()))?;
        Ok((numel, self.size.dtype(ty.dtype)))
    }

    fn create(&mut self, buf: Buf, at: usize) -> Result<(), BufferError> {
        if let Some(&b) = self.live.get(&buf) {
            // Written again while alive: the same memory.
            self.blocks[b].last = at;
            return Ok(());
        }
        let (numel, dtype) = self.tensor(&buf.tensor)?;
        self.live.insert(buf.clone(), self.blocks.len());
        self.blocks.push(Block {
            buf,
            first: at,
            last: at,
            bytes: bytes(numel, dtype),
            offset: 0,
        });
        Ok(())
    }

    fn read(&mut self, buf: &Buf, at: usize) -> Result<(), BufferError> {
        let b = self.live.get(buf).ok_or_else(|| not_live("reads", buf))?;
        self.blocks[*b].last = at;
        Ok(())
    }

    fn free(&mut self, buf: &Buf, at: usize) -> Result<(), BufferError> {
        let b = self.live.remove(buf).ok_or_else(|| not_live("frees", buf))?;
        self.blocks[b].last = at;
        Ok(())
    }

    /// What instruction `at` does to the transient buffers (the others
    /// touch only weights, gradient accumulators and optimizer state).
    fn instr(&mut self, at: usize, instr: &Instr) -> Result<(), BufferError> {
        let g = self.g;
        match instr.buffers() {
            BufferUse::Creates(buf) => self.create(buf, at),
            BufferUse::Reads(buf) => self.read(buf, at),
            BufferUse::Frees(buf) => self.free(buf, at),
            BufferUse::Gradients { params, micro_batch } => params.iter().try_for_each(|param| {
                let grad = self
                    .gradients
                    .get(param.as_str())
                    .ok_or_else(|| BufferError::NoGradient(param.to_string()))?;
                self.read(&Buf::of(grad, micro_batch), at)
            }),
            BufferUse::Node { node, micro_batch } => {
                let n = g.node(
                    *self
                        .nodes
                        .get(node)
                        .ok_or_else(|| BufferError::NoNode(node.to_string()))?,
                );
                for x in operands(g, n) {
                    match x {
                        Operand::Buffer(x) => self.read(&Buf::of(&g.tensor(x).name, micro_batch), at)?,
                        // A gathered copy if there is one, else the stored weight.
                        Operand::Param(x) => {
                            let gathered = Buf::step(&g.tensor(x).name);
                            if self.live.contains_key(&gathered) {
                                self.read(&gathered, at)?;
                            }
                        }
                    }
                }
                for &o in &n.outputs {
                    self.create(Buf::of(&g.tensor(o).name, micro_batch), at)?;
                }
                Ok(())
            }
            BufferUse::Nothing => Ok(()),
        }
    }
}

fn not_live(action: &'static str, buf: &Buf) -> BufferError {
    BufferError::NotAlive {
        action,
        buf: buf.clone(),
    }
}

/// Bytes of `numel` elements of `dtype`.
fn bytes(numel: u64, dtype: DType) -> u64 {
    (numel * dtype.size_bits() as u64).div_ceil(8)
}

/// The weights, gradient accumulators and optimizer state `program` keeps.
fn model_state(life: &Lifetimes, program: &Program) -> Result<ModelState, MemoryError> {
    let mut stepped = HashMap::new();
    let mut accumulated = HashSet::new();
    // Parameters whose micro-batch gradients are reduce-scattered, by parts.
    let mut sharded = HashMap::new();
    for instr in &program.instructions {
        match instr {
            Instr::OptimizerStep { param, shard } => {
                stepped.insert(param.as_str(), shard.map_or(1, |s| s.parts as u64));
            }
            Instr::AccumulateGrad { param, .. } => {
                accumulated.insert(param.as_str());
            }
            Instr::ReduceScatterGrad {
                params,
                group,
                micro_batch: Some(_),
                ..
            } => sharded.extend(params.iter().map(|p| (p.as_str(), group.len() as u64))),
            _ => {}
        }
    }
    let mut state = ModelState::default();
    for slot in &program.params {
        let (numel, dtype) = life.tensor(&slot.name).map_err(|source| MemoryError::Param {
            rank: program.rank,
            param: slot.name.clone(),
            source,
        })?;
        let stored = slot.stored_shard.map_or(1, |s| s.parts as u64);
        state.weights += bytes(numel.div_ceil(stored), dtype);
        if accumulated.contains(slot.name.as_str()) {
            state.gradients += bytes(numel, dtype);
        } else if let Some(parts) = sharded.get(slot.name.as_str()) {
            state.gradients += bytes(numel.div_ceil(*parts), dtype);
        }
        if let Some(parts) = stepped.get(slot.name.as_str()) {
            let elements = numel.div_ceil(*parts) as f64;
            state.optimizer += (elements * optimizer_bytes_per_param(dtype)).round() as u64;
        }
    }
    Ok(state)
}

/// The sum of the weights of the lifetimes `(first, last, weight)` alive at
/// each of `span` instructions.
fn live_sums(lifetimes: impl Iterator<Item = (usize, usize, u64)>, span: usize) -> Vec<u64> {
    let mut delta = vec![0i128; span + 1];
    for (first, last, weight) in lifetimes {
        delta[first.min(span)] += i128::from(weight);
        delta[(last + 1).min(span)] -= i128::from(weight);
    }
    let mut live = 0i128;
    delta[..span]
        .iter()
        .map(|d| {
            live += d;
            live as u64
        })
        .collect()
}

/// The largest sum of `weight` over the blocks alive at one of
/// `instructions`, and the first instruction where it is reached.
fn peak(blocks: &[Block], instructions: usize, weight: impl Fn(&Block) -> u64) -> (u64, usize) {
    let sums = live_sums(blocks.iter().map(|b| (b.first, b.last, weight(b))), instructions);
    sums.iter().enumerate().fold(
        (0, 0),
        |best, (at, &sum)| if sum > best.0 { (sum, at) } else { best },
    )
}

/// Offsets for lifetimes `(first, last, extent)` (instructions inclusive):
/// the smallest of three greedy placements (none always wins), each block
/// at the lowest offset clear of the placed blocks alive with it, taking
/// the blocks largest extent first, largest extent × lifetime first, and
/// by the most bytes alive at any instruction of their lifetime ("greedy
/// by breadth": the blocks of the peak first), ties largest first. Extents that are multiples
/// of [`ALIGNMENT`] give aligned offsets.
fn place(lifetimes: &[(usize, usize, u64)]) -> Vec<u64> {
    let span = lifetimes.iter().map(|l| l.1 + 1).max().unwrap_or(0);
    let breadth = RangeMax::new(live_sums(lifetimes.iter().copied(), span));
    let mut by_size: Vec<usize> = (0..lifetimes.len()).collect();
    by_size.sort_by_key(|&i| (Reverse(lifetimes[i].2), lifetimes[i].0, i));
    let area = |(first, last, extent): (usize, usize, u64)| u128::from(extent) * (last - first + 1) as u128;
    let mut by_area = by_size.clone();
    by_area.sort_by_key(|&i| Reverse(area(lifetimes[i])));
    let mut by_breadth = by_size.clone();
    by_breadth.sort_by_key(|&i| Reverse(breadth.max(lifetimes[i].0, lifetimes[i].1)));
    let top = |offsets: &[u64]| {
        offsets
            .iter()
            .zip(lifetimes)
            .map(|(o, l)| o + l.2)
            .max()
            .unwrap_or(0)
    };
    [by_size, by_area, by_breadth]
        .iter()
        .map(|order| place_in_order(lifetimes, span, order))
        .min_by_key(|offsets| top(offsets))
        .unwrap_or_default()
}

/// The largest of some values over any range of them in constant time (a
/// sparse table: level `k` holds the maxima of the runs of `2^k`).
struct RangeMax {
    levels: Vec<Vec<u64>>,
}

impl RangeMax {
    fn new(values: Vec<u64>) -> RangeMax {
        let mut levels = vec![values];
        let mut half = 1;
        while let Some(prev) = levels.last().filter(|l| l.len() > half) {
            let next = (0..prev.len() - half)
                .map(|i| prev[i].max(prev[i + half]))
                .collect();
            levels.push(next);
            half *= 2;
        }
        RangeMax { levels }
    }

    /// The largest value in `first..=last`.
    fn max(&self, first: usize, last: usize) -> u64 {
        let k = (last - first + 1).ilog2() as usize;
        self.levels[k][first].max(self.levels[k][last + 1 - (1 << k)])
    }
}

/// Places the blocks in `order`, each at the lowest offset clear of the
/// already placed ones alive with it.
fn place_in_order(lifetimes: &[(usize, usize, u64)], span: usize, order: &[usize]) -> Vec<u64> {
    let mut placed = TimeIndex::new(span);
    let mut offsets = vec![0; lifetimes.len()];
    let (mut near, mut taken) = (Vec::new(), Vec::new());
    for &i in order {
        let (first, last, extent) = lifetimes[i];
        if extent == 0 {
            continue;
        }
        near.clear();
        placed.overlapping(first, last, &mut near);
        taken.clear();
        taken.extend(near.iter().map(|&j| {
            let j = j as usize;
            (offsets[j], offsets[j] + lifetimes[j].2)
        }));
        taken.sort_unstable();
        offsets[i] = first_fit(&taken, extent);
        placed.insert(i as u32, first, last);
    }
    offsets
}

/// The lowest offset with `extent` bytes free above it among `taken`
/// (sorted `(start, end)` ranges, possibly overlapping each other).
fn first_fit(taken: &[(u64, u64)], extent: u64) -> u64 {
    let mut top = 0;
    for &(start, end) in taken {
        if start >= top + extent {
            break;
        }
        top = top.max(end);
    }
    top
}

/// Placed blocks, found by the instructions their lifetimes cover: a
/// segment tree over the instructions holding each block at the nodes that
/// tile its lifetime (those alive at one instruction lie on one root-leaf
/// path), and the blocks by first instruction.
struct TimeIndex {
    leaves: usize,
    cover: Vec<Vec<u32>>,
    starts: BTreeMap<usize, Vec<u32>>,
}

impl TimeIndex {
    fn new(instructions: usize) -> TimeIndex {
        let leaves = instructions.next_power_of_two();
        TimeIndex {
            leaves,
            cover: vec![Vec::new(); 2 * leaves],
            starts: BTreeMap::new(),
        }
    }

    fn insert(&mut self, block: u32, first: usize, last: usize) {
        let (mut lo, mut hi) = (first + self.leaves, last + 1 + self.leaves);
        while lo < hi {
            if lo & 1 == 1 {
                self.cover[lo].push(block);
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                self.cover[hi].push(block);
            }
            lo >>= 1;
            hi >>= 1;
        }
        self.starts.entry(first).or_default().push(block);
    }

    /// Appends each block alive during `first..=last` once: those alive at
    /// `first`, then those starting after it.
    fn overlapping(&self, first: usize, last: usize, out: &mut Vec<u32>) {
        let mut node = first + self.leaves;
        while node >= 1 {
            out.extend_from_slice(&self.cover[node]);
            node >>= 1;
        }
        for blocks in self
            .starts
            .range((Excluded(first), Included(last)))
            .map(|(_, b)| b)
        {
            out.extend_from_slice(blocks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_first_at_the_lowest_offset_clear_of_what_is_alive() {
        // (first, last, extent) → offset (both orders agree here):
        // a [0, 3] 1024 → 0 (largest, alone)
        // b [0, 1]  512 → 1024 (alive with a)
        // c [2, 3]  512 → 1024 (b is dead by then: reuses its bytes)
        // d [1, 2]  256 → 1536 (alive with a, b and c)
        // e [4, 5]  768 → 0 (everything else is dead)
        // f [5, 5]  256 → 768 (on top of e; a is dead)
        let lifetimes = [
            (0, 3, 1024),
            (0, 1, 512),
            (2, 3, 512),
            (1, 2, 256),
            (4, 5, 768),
            (5, 5, 256),
        ];
        assert_eq!(place(&lifetimes), [0, 1024, 1024, 1536, 0, 768]);
        // d fills the 512-byte hole b leaves between a and c once it dies
        // at 0, rather than going on top at 2048.
        let hole = [(0, 2, 1024), (0, 0, 512), (0, 2, 512), (1, 2, 256)];
        assert_eq!(place(&hole), [0, 1024, 1536, 1024]);
    }

    #[test]
    fn the_order_with_the_smallest_arena_wins() {
        // 1792 bytes alive at instructions 1 (c, d) and 3 (a, b). Largest
        // first (c, b, d, a): c → 0, b → 0 (c is dead by 3), d → 1024 above
        // c, a → 1792 above b and d: 2560 bytes. By breadth every block
        // meets the peak, so the order is the same. By extent × lifetime
        // (c, d, a, b): a fits below d at 0 and b goes above it at 768:
        // 1792 bytes.
        let lifetimes = [(2, 3, 768), (3, 3, 1024), (0, 1, 1024), (1, 2, 768)];
        assert_eq!(place_in_order(&lifetimes, 4, &[2, 1, 3, 0]), [1792, 0, 0, 1024]);
        assert_eq!(place(&lifetimes), [0, 768, 0, 1024]);
        // 2304 bytes alive at instruction 3 (b, c, d). Largest first (a, c,
        // d, b; also by area): a → 0, c → 1024, d → 0 (a is dead by 3), b
        // above c at 2048: 2560. By breadth the peak's blocks come first
        // (c, d, b → 0, 1024, 1792) and a goes above c at 1024: 2304.
        let lifetimes = [(0, 2, 1024), (3, 3, 512), (2, 3, 1024), (3, 3, 768)];
        assert_eq!(place_in_order(&lifetimes, 4, &[0, 2, 3, 1]), [0, 2048, 1024, 0]);
        assert_eq!(place(&lifetimes), [1024, 1792, 0, 1024]);
    }

    #[test]
    fn range_maxima_and_live_sums() {
        let m = RangeMax::new(vec![3, 1, 4, 1, 5, 9, 2, 6]);
        assert_eq!(
            [m.max(0, 0), m.max(0, 3), m.max(1, 1), m.max(3, 7), m.max(6, 7)],
            [3, 4, 1, 9, 6]
        );
        assert_eq!(live_sums([(0, 1, 5), (1, 3, 2)].into_iter(), 4), [5, 7, 2, 2]);
    }

    #[test]
    fn first_fit_takes_the_lowest_gap_that_holds_the_block() {
        assert_eq!(first_fit(&[(512, 768), (1024, 2048)], 256), 0);
        assert_eq!(first_fit(&[(0, 256), (768, 1024)], 512), 256);
        assert_eq!(first_fit(&[(0, 256), (512, 1024)], 512), 1024);
        // Nothing fits between: on top of the highest end, overlaps included.
        assert_eq!(first_fit(&[(0, 1024), (256, 512)], 256), 1024);
        assert_eq!(first_fit(&[], 256), 0);
    }

    #[test]
    fn the_time_index_finds_exactly_the_overlapping_blocks() {
        let spans = [(0, 9), (3, 4), (5, 7), (8, 8), (2, 2)];
        let mut index = TimeIndex::new(10);
        for (i, &(a, b)) in spans.iter().enumerate() {
            index.insert(i as u32, a, b);
        }
        for (first, last) in [(0, 0), (3, 5), (4, 4), (6, 9), (9, 9), (2, 3)] {
            let mut got = Vec::new();
            index.overlapping(first, last, &mut got);
            got.sort_unstable();
            let want: Vec<u32> = (0..spans.len() as u32)
                .filter(|&i| {
                    let (a, b) = spans[i as usize];
                    a <= last && first <= b
                })
                .collect();
            assert_eq!(got, want, "{first}..={last}");
        }
    }

    fn block(tensor: &str, first: usize, last: usize, bytes: u64, offset: u64) -> Block {
        Block {
            buf: Buf::of(tensor, 0),
            first,
            last,
            bytes,
            offset,
        }
    }

    #[test]
    fn check_finds_blocks_alive_together_that_share_bytes() {
        let plan = |blocks| MemoryPlan::new(0, blocks, 4, ModelState::default());
        // Same bytes at disjoint times, and overlapping times at disjoint bytes.
        let good = plan(vec![
            block("a", 0, 1, 300, 0),
            block("b", 2, 3, 512, 0),
            block("c", 1, 2, 100, 512),
        ]);
        assert_eq!(check(&good), Ok(()));
        assert_eq!(
            (good.arena_bytes, good.peak_live_bytes, good.peak_at),
            (768, 768, 1)
        );
        assert_eq!(good.offset(&Buf::of("c", 0), 2), Some(512));
        assert_eq!(good.offset(&Buf::of("c", 0), 3), None);
        // a's 300 bytes take 512 (aligned): c at 256 collides at instruction 1.
        let bad = plan(vec![block("a", 0, 1, 300, 0), block("c", 1, 2, 100, 256)]);
        assert_eq!(
            check(&bad).unwrap_err().to_string(),
            "c@mb0 (instructions 1..=2, bytes 256..512) overlaps a@mb0 (instructions 0..=1, bytes 0..512)"
        );
        let misaligned = plan(vec![block("a", 0, 1, 300, 128)]);
        let e = check(&misaligned).unwrap_err();
        assert!(
            matches!(&e, PlacementError::Misplaced { block, .. } if block.offset == 128),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("a@mb0 (instructions 0..=1, bytes 128..640) is misaligned"),
            "{e}"
        );
    }

    #[test]
    fn float_buffers_take_the_planned_type_and_the_rest_their_own() {
        assert_eq!(ElementSize::Float(DType::Bf16).dtype(DType::F32), DType::Bf16);
        assert_eq!(ElementSize::Float(DType::Bf16).dtype(DType::I64), DType::I64);
        assert_eq!(ElementSize::AsGraph.dtype(DType::F32), DType::F32);
        assert_eq!(bytes(3, DType::Bf16), 6);
        assert_eq!(bytes(3, DType::Bool), 3);
    }
}
