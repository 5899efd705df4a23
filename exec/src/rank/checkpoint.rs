//! A rank's side of checkpoints: copying the pieces it writes to the host
//! at the end of a step, and starting from a checkpoint's whole tensors,
//! cut as the rank holds them.

use super::{slice_of, Failure, RankError, RankRun};
use crate::backend::Backend;
use crate::checkpoint::layout::{shard_range, slice_numel, Role};
use crate::checkpoint::{Restored, Saver, Snapshot};
use crate::slices;
use crate::train::Optimizer;
use autopar_comm::collective::values::slice;
use autopar_ir::Value;
use autopar_lower::TrainingGraph;

/// The checkpoint's whole weight for `param`: its own, or, for a tied copy
/// the checkpoint lacks (another plan kept none), its original's.
pub(super) fn restored_weight<'r>(t: &TrainingGraph, r: &'r Restored, param: &str) -> Option<&'r Value> {
    r.weight(param).or_else(|| r.weight(original(t, param)?))
}

/// The parameter `param` is a tied copy of, if it is one.
fn original<'t>(t: &'t TrainingGraph, param: &str) -> Option<&'t str> {
    t.tied
        .iter()
        .find(|(_, copy)| copy == param)
        .map(|(o, _)| o.as_str())
}

impl<B: Backend> RankRun<'_, B> {
    /// Copies the pieces this rank writes to the host and hands them to the
    /// saver, which writes them while training goes on.
    pub(super) fn snapshot(&mut self, saver: &Saver, completed: usize) -> Result<(), Failure> {
        let mut pieces = Vec::new();
        for (held, key) in saver.writes_of(self.program.rank) {
            let param = held.param.as_str();
            let value = match held.role {
                Role::Weight => {
                    let weight = self.weights.get(param).ok_or_else(|| super::missing(param))?;
                    let host = self.dev.download(weight)?;
                    // A ZeRO-3 weight is stored as its (padded) shard alone.
                    let stored_start = match self.shards.get(param) {
                        Some(&shard) => shard_range(slice_numel(self.t, param).unwrap_or(0), Some(shard)).0,
                        None => 0,
                    };
                    slice(&host, held.start - stored_start, held.len)
                }
                Role::Slot(k) => {
                    let state = self
                        .states
                        .get(param)
                        .ok_or_else(|| RankError::NoState(param.to_string()))?;
                    let slots = self.dev.save_state(state)?;
                    let slot = slots
                        .get(k)
                        .ok_or_else(|| RankError::NoState(param.to_string()))?;
                    slice(slot, 0, held.len)
                }
            };
            pieces.push((key.clone(), value));
        }
        saver.submit(Snapshot {
            rank: self.program.rank,
            completed,
            pieces,
        });
        Ok(())
    }

    /// The restored optimizer state of elements `[start, start + len)` of
    /// this rank's slice of `param`; `None` where the run starts fresh.
    pub(super) fn restored_state(
        &mut self,
        optimizer: &Optimizer,
        param: &str,
        start: usize,
        len: usize,
    ) -> Result<Option<B::State>, Failure> {
        let Some(restore) = self.opts.restore.as_ref() else {
            return Ok(None);
        };
        let Some(whole) = restore
            .state(param)
            .or_else(|| restore.state(original(self.t, param)?))
        else {
            return Ok(None);
        };
        let cut = slice_of(self.t, param, self.program.coord);
        let slots: Vec<Value> = whole
            .iter()
            .map(|v| {
                let mine = match cut {
                    Some((s, index, parts)) => slices::take(v, s.axis, s.blocks, index, parts),
                    None => v.clone(),
                };
                slice(&mine, start, len)
            })
            .collect();
        Ok(Some(self.dev.load_state(optimizer, &slots)?))
    }
}
