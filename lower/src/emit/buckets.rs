//! Gradient buckets: a gradient that crosses a data-parallel group joins
//! the open bucket of its group as the backward pass completes it, and the
//! bucket is issued as one collective once it holds `Strategy::bucket_bytes`
//! ([`BucketFill`], the rule the estimate counts collectives with) or when
//! nothing more can join it. ZeRO-0/1 bucket each parameter once per step,
//! after its last accumulation; ZeRO-2/3 bucket every micro-batch's
//! gradient as that micro-batch's backward pass completes it, so a
//! full-size gradient lives only until its bucket is reduced.

use super::frees::Key;
use super::Emitter;
use crate::program::Instr;
use autopar_cost_models::comm::BucketFill;
use std::collections::BTreeMap;

/// Which open bucket a gradient joins: its data-parallel group (whether
/// the weight is an expert's) and, under ZeRO-2/3, its micro-batch.
pub(super) type Slot = (bool, Option<usize>);

/// A bucket being filled: its parameters in order, and the micro-batch
/// gradient buffers it reads (ZeRO-2/3).
struct Open {
    fill: BucketFill,
    params: Vec<String>,
    buffers: Vec<Key>,
}

/// The open buckets of a rank's step.
#[derive(Default)]
pub(super) struct Buckets {
    open: BTreeMap<Slot, Open>,
    /// Gradients still to join each slot in the backward pass: when none
    /// are, its open bucket is issued.
    left: BTreeMap<Slot, usize>,
}

impl Emitter<'_, '_> {
    /// Whether `param`'s gradient is reduce-scattered per micro-batch
    /// (ZeRO-2/3, reducing in the backward pass) rather than accumulated whole.
    fn sharded_as_reduced(&self, param: &str) -> bool {
        self.l.s.zero >= 2 && self.reduce_early.contains_key(param)
    }

    /// The slot `param`'s gradient of micro-batch `mb` (ZeRO-2/3) or of the step joins.
    pub(super) fn slot(&self, param: &str, mb: Option<usize>) -> Slot {
        (self.l.t.expert_slices.contains_key(param), mb)
    }

    /// Counts the gradients each slot awaits in the backward pass: one per
    /// parameter reduced early, or (ZeRO-2/3) one per micro-batch of each.
    pub(super) fn plan_buckets(&mut self) {
        let mut left = BTreeMap::new();
        for (param, &accumulations) in &self.reduce_early {
            let micro_batches: Vec<Option<usize>> = match self.sharded_as_reduced(param) {
                true => (0..accumulations).map(Some).collect(),
                false => vec![None],
            };
            for mb in micro_batches {
                *left.entry(self.slot(param, mb)).or_insert(0) += 1;
            }
        }
        self.buckets.left = left;
    }

    /// Micro-batch `mb`'s gradient of `param` is computed (in `buffer`):
    /// accumulated into the step's gradient, or (ZeRO-2/3) left in its
    /// buffer for its bucket to read; then bucketed if that completes what
    /// the backward pass reduces of it.
    pub(super) fn gradient(&mut self, param: &str, mb: usize, buffer: Option<Key>) {
        let sharded = self.sharded_as_reduced(param);
        if !sharded {
            if let Some(buffer) = buffer {
                self.lifetimes.used(buffer, self.out.len());
            }
            self.out.push(Instr::AccumulateGrad {
                param: param.to_string(),
                micro_batch: mb,
            });
        }
        let Some(left) = self.reduce_early.get_mut(param) else {
            return;
        };
        *left -= 1;
        let last = *left == 0;
        if last {
            self.reduce_early.remove(param);
            self.reduced.insert(param.to_string());
        }
        let slot = match (sharded, last) {
            (true, _) => self.slot(param, Some(mb)),
            (false, true) => self.slot(param, None),
            (false, false) => return,
        };
        self.join_bucket(param, slot, buffer.filter(|_| sharded));
        if let Some(left) = self.buckets.left.get_mut(&slot) {
            *left -= 1;
            if *left == 0 {
                self.issue(slot);
            }
        }
    }

    /// Adds `param` (reading `buffer`, if any) to `slot`'s open bucket, and
    /// issues the bucket if that fills it.
    pub(super) fn join_bucket(&mut self, param: &str, slot: Slot, buffer: Option<Key>) {
        let bytes = self.l.grad_bytes.get(param).copied().unwrap_or(0.0);
        let cap = self.l.s.bucket_bytes as f64;
        let open = self.buckets.open.entry(slot).or_insert_with(|| Open {
            fill: BucketFill::new(cap),
            params: Vec::new(),
            buffers: Vec::new(),
        });
        open.params.push(param.to_string());
        open.buffers.extend(buffer);
        if open.fill.add(bytes) {
            self.issue(slot);
        }
    }

    /// Issues what `slot`'s open bucket holds, if anything, as one collective.
    fn issue(&mut self, slot: Slot) {
        let Some(open) = self.buckets.open.remove(&slot) else {
            return;
        };
        let Some(first) = open.params.first() else {
            return;
        };
        let group = self.dp_group(first);
        for buffer in open.buffers {
            self.lifetimes.used(buffer, self.out.len());
        }
        let reduction = self.reduction(open.params, group, slot.1);
        self.out.push(reduction);
    }

    /// Issues every open bucket: nothing more joins them this step.
    pub(super) fn issue_all(&mut self) {
        let slots: Vec<Slot> = self.buckets.open.keys().copied().collect();
        for slot in slots {
            self.issue(slot);
        }
    }
}
