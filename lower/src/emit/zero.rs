//! The data-parallel end of a rank's step: gradient reductions (in
//! buckets, most in the backward pass: see `buckets`), optimizer steps
//! and parameter traffic as the ZeRO stage asks (ZeRO-1/2's refresh of the
//! weights in buckets too), and the
//! sums and copies of weights shared between pipeline stages.

use super::Emitter;
use crate::program::{Instr, ParamSlot, Shard};
use crate::LowerError;
use autopar_cost_models::comm::BucketFill;
use std::collections::{BTreeMap, BTreeSet};

impl Emitter<'_, '_> {
    /// The virtual stages this rank runs.
    pub(super) fn my_stages(&self) -> BTreeSet<usize> {
        let s = self.l.s;
        (0..s.chunks).map(|c| c * s.pp + self.coord.pp).collect()
    }

    /// The ranks (of this replica) holding a parameter used on virtual stages `users`.
    pub(super) fn holders(&self, users: &BTreeSet<usize>) -> BTreeSet<usize> {
        users.iter().map(|&vs| self.stage_rank(vs)).collect()
    }

    /// The parameters this rank alone updates whose gradients cross a
    /// data-parallel group, with the accumulations each gets per step (one
    /// per micro-batch): their reduction can start in the backward pass.
    /// Tied parameters wait for [`Instr::SumTiedGrads`] after it.
    pub(super) fn early_reductions(&mut self) -> BTreeMap<String, usize> {
        let l = self.l;
        let s = l.s;
        let my_vs = self.my_stages();
        let tied: BTreeSet<&String> = l.t.tied.iter().flat_map(|(a, b)| [a, b]).collect();
        let mut early = BTreeMap::new();
        for (param, users) in &l.param_users {
            let holders = self.holders(users);
            let owned = l
                .param_owner
                .get(param)
                .is_some_and(|&vs| self.stage_rank(vs) == self.rank);
            if users.is_disjoint(&my_vs) || tied.contains(param) || !owned || holders.len() > 1 {
                continue;
            }
            if self.dp_group(param).len() > 1 {
                early.insert(param.clone(), s.micro_batches);
            }
        }
        early
    }

    /// The gradient reduction of a bucket the ZeRO stage asks for: an
    /// all-reduce (ZeRO-0), or a reduce-scatter that leaves each rank the
    /// shards it steps (ZeRO-1 to 3: Megatron-LM's distributed optimizer
    /// moves two volumes, a reduce-scatter and the weights' all-gather, not
    /// three), of micro-batch `mb`'s gradients (ZeRO-2/3 in the backward
    /// pass) or of the step's.
    pub(super) fn reduction(&self, params: Vec<String>, group: Vec<usize>, mb: Option<usize>) -> Instr {
        let s = self.l.s;
        match s.zero {
            0 => Instr::AllReduceGrad {
                params,
                group,
                reduction: s.reduction,
                compression: s.compression,
            },
            _ => Instr::ReduceScatterGrad {
                params,
                group,
                micro_batch: mb,
                compression: s.compression,
            },
        }
    }

    /// The optimizer step of one parameter, after its gradient's
    /// reduction: of the whole parameter (ZeRO-0, or no data-parallel
    /// group), else of this rank's shard.
    fn update(&mut self, param: &str, group: &[usize], shard: Option<Shard>) {
        self.out.push(Instr::OptimizerStep {
            param: param.to_string(),
            shard: shard.filter(|_| group.len() > 1),
        });
    }

    /// ZeRO-1/2: `param` is stepped; its weights join the open refresh
    /// bucket of its group (dense or expert), all-gathered as one collective
    /// once it holds the gradient buckets' cap ([`BucketFill`]: the rule the
    /// estimate counts collectives with) or when every weight is stepped.
    fn refresh(&mut self, open: &mut BTreeMap<bool, (BucketFill, Vec<String>)>, param: &str) {
        let expert = self.l.t.expert_slices.contains_key(param);
        let cap = self.l.s.bucket_bytes as f64;
        let bytes = self.l.grad_bytes.get(param).copied().unwrap_or(0.0);
        let (fill, params) = open
            .entry(expert)
            .or_insert_with(|| (BucketFill::new(cap), Vec::new()));
        params.push(param.to_string());
        if fill.add(bytes) {
            let params = std::mem::take(params);
            self.gather_refreshed(params);
        }
    }

    /// All-gathers the refreshed weights `params` (one group's) as one collective.
    fn gather_refreshed(&mut self, params: Vec<String>) {
        if let Some(first) = params.first() {
            let group = self.dp_group(first);
            self.out.push(Instr::AllGatherParams { params, group });
        }
    }

    /// Gradient reduction (of what was not reduced in the backward pass),
    /// optimizer steps and parameter traffic after the last backward pass;
    /// returns the parameters this rank holds.
    pub(super) fn optimizer(&mut self) -> Result<Vec<ParamSlot>, LowerError> {
        let s = self.l.s;
        let my_vs = self.my_stages();
        let mut slots = Vec::new();
        for (original, copy) in &self.l.t.tied {
            let owners: BTreeMap<usize, Vec<String>> = [original, copy]
                .into_iter()
                .filter_map(|p| {
                    let vs = *self.l.param_owner.get(p)?;
                    Some((self.stage_rank(vs), p.clone()))
                })
                .fold(BTreeMap::new(), |mut m, (r, p)| {
                    m.entry(r).or_insert_with(Vec::new).push(p);
                    m
                });
            if let Some(params) = owners.get(&self.rank) {
                self.out.push(Instr::SumTiedGrads {
                    key: original.clone(),
                    params: params.clone(),
                    group: owners.keys().copied().collect(),
                });
            }
        }
        // What the backward pass left in open buckets, then the gradients
        // that reduce only now (tied copies after their sum, weights shared
        // by stages), bucketed alike.
        self.issue_all();
        let mut receives = Vec::new();
        let mut updates = Vec::new();
        let l = self.l;
        for (param, users) in &l.param_users {
            if users.is_disjoint(&my_vs) {
                continue;
            }
            let group = self.dp_group(param);
            let shard = (s.zero > 0).then(|| Shard {
                index: group.iter().position(|&r| r == self.rank).unwrap_or(0),
                parts: group.len(),
            });
            slots.push(ParamSlot {
                name: param.clone(),
                stored_shard: if s.zero == 3 { shard } else { None },
            });
            let Some(&owner_vs) = l.param_owner.get(param) else {
                continue;
            };
            let holders = self.holders(users);
            let owner = self.stage_rank(owner_vs);
            if holders.len() > 1 && s.zero == 3 {
                return Err(LowerError::Unsupported(format!(
                    "parameter '{param}' is used on two pipeline stages; ZeRO-3 with weights shared across stages"
                )));
            }
            if owner != self.rank {
                receives.push(Instr::RecvParam {
                    param: param.clone(),
                    from: owner,
                });
                continue;
            }
            if group.len() > 1 && !self.reduced.contains(param) {
                self.join_bucket(param, self.slot(param, None), None);
            }
            updates.push((param, group, shard, holders));
        }
        self.issue_all();
        // Copies of shared weights are sent once every weight is whole again.
        let mut sends = Vec::new();
        let mut open = BTreeMap::new();
        for (param, group, shard, holders) in updates {
            self.update(param, &group, shard);
            if (s.zero == 1 || s.zero == 2) && group.len() > 1 {
                self.refresh(&mut open, param);
            }
            for &to in holders.iter().filter(|&&r| r != self.rank) {
                sends.push(Instr::SendParam {
                    param: param.clone(),
                    to,
                });
            }
        }
        for (_, params) in open.into_values() {
            self.gather_refreshed(params);
        }
        self.out.extend(sends);
        self.out.extend(receives);
        Ok(slots)
    }
}
