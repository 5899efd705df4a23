//! The optimizer update of a parameter (or of this rank's ZeRO shard of
//! it), and the gradients a run records for checking.

use super::{missing, slice_of, Failure, GradPiece, RankError, RankRun};
use crate::backend::Backend;
use crate::checkpoint::layout::shard_range;
use crate::train::decays;
use autopar_comm::collective::values::slice;
use autopar_ir::{Graph, TensorId};
use autopar_lower::Shard;

impl<B: Backend> RankRun<'_, B> {
    /// The optimizer update of `param` (or of this rank's shard of it).
    pub(super) fn step(
        &mut self,
        param: &str,
        shard: Option<Shard>,
        step: usize,
        grads_out: &mut Vec<GradPiece>,
    ) -> Result<(), Failure> {
        let grad = self
            .grads
            .remove(param)
            .ok_or_else(|| RankError::NoGradient(param.to_string()))?;
        let weight_numel = self
            .weights
            .get(param)
            .map(|w| self.dev.numel(w))
            .ok_or_else(|| missing(param))?;
        let rank = self.t.graph.tensor(self.tensors[param]).ty.shape.rank();
        let numel = if self.shards.contains_key(param) {
            grad_numel(&self.t.graph, self.tensors[param])
        } else {
            weight_numel
        };
        let full_grad = self.dev.numel(&grad) == numel && shard.is_some();
        // The range a checkpoint's layout records for this rank's state.
        let (start, len) = shard_range(numel, shard);
        let optimizer = if decays(rank) {
            self.opts.optimizer
        } else {
            self.opts.optimizer.without_decay()
        };
        if !self.states.contains_key(param) {
            let state = match self.restored_state(&optimizer, param, start, len)? {
                Some(state) => state,
                None => self.dev.new_state(&optimizer, len)?,
            };
            self.states.insert(param.to_string(), state);
        }
        let gstart = if full_grad { start } else { 0 };
        let wstart = if self.shards.contains_key(param) { 0 } else { start };
        let n = (step + 1) as u64;
        let (Some(state), Some(weight)) = (self.states.get_mut(param), self.weights.get_mut(param)) else {
            return Err(missing(param).into());
        };
        self.dev
            .update(
                &optimizer,
                state,
                n,
                weight,
                wstart..wstart + len,
                &grad,
                gstart..gstart + len,
            )
            .map_err(|source| RankError::Update {
                param: param.to_string(),
                source,
            })?;
        if self.opts.record_grads && step == 0 {
            let grad = self.host(&grad)?;
            let recorded = if full_grad {
                slice(&grad, start, len)
            } else {
                slice(&grad, 0, len)
            };
            grads_out.push(GradPiece {
                param: param.to_string(),
                slice: slice_of(self.t, param, self.program.coord).map_or(0, |s| s.1),
                shard,
                value: recorded,
            });
        }
        Ok(())
    }
}

fn grad_numel(g: &Graph, id: TensorId) -> usize {
    g.tensor(id)
        .ty
        .shape
        .0
        .iter()
        .map(|d| d.fixed().unwrap_or(1))
        .product()
}
