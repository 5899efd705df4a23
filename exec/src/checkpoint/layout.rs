//! Which rank writes which piece of which tensor: one function of the
//! programs, so every process of a launched run computes the same answer
//! without asking the others, and the index describes exactly what the
//! files hold.
//!
//! A piece is a flat range of one rank's slice of a parameter (its tensor-
//! or expert-parallel slice, the whole parameter where it is not sliced).
//! The ranks that update a parameter are the authority on it: their weight
//! range (the ZeRO shard they step, or the whole slice) is fresh at the end
//! of a step, even where ZeRO-1/2 refreshes the rest of a stored whole
//! weight only later. Replicas (data-parallel copies) hold equal pieces;
//! the lowest rank writes each.

use autopar_lower::{Coord, Instr, Program, Shard, TrainingGraph};
use std::collections::{BTreeMap, HashSet};

/// What a piece holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Role {
    Weight,
    /// Optimizer state slot `k` ([`crate::train::Optimizer::slot_names`]).
    Slot(usize),
}

/// One piece a rank writes: elements `[start, start + len)` of slice
/// `slice` of `param`, flattened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Held {
    pub param: String,
    pub role: Role,
    pub slice: usize,
    pub start: usize,
    pub len: usize,
}

/// How a parameter is cut into slices across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub axis: usize,
    pub blocks: usize,
    pub parts: usize,
}

/// The cut of `param` in `t`, `None` where every rank holds it whole.
pub(crate) fn cut_of(t: &TrainingGraph, param: &str) -> Option<Cut> {
    if let Some(s) = t.slices.get(param) {
        return Some(Cut {
            axis: s.axis,
            blocks: s.blocks,
            parts: t.tp,
        });
    }
    t.expert_slices.get(param).map(|s| Cut {
        axis: s.axis,
        blocks: s.blocks,
        parts: t.ep,
    })
}

/// Which slice of `param` the rank at `coord` holds (0 where it is whole):
/// tensor-parallel slices by the tensor-parallel index, experts by the
/// rank's place in its expert-parallel group.
pub(crate) fn slice_index(t: &TrainingGraph, param: &str, coord: Coord) -> usize {
    if t.slices.contains_key(param) {
        coord.tp
    } else if t.expert_slices.contains_key(param) {
        coord.dp % t.ep
    } else {
        0
    }
}

/// The elements of one slice of `param` (the whole parameter, divided by
/// its cut's parts); `None` for a parameter without data.
pub(crate) fn slice_numel(t: &TrainingGraph, param: &str) -> Option<usize> {
    let id = t.graph.tensors().find(|(_, x)| x.name == param)?.0;
    let whole = t.graph.tensor(id).data.as_ref()?.numel();
    Some(whole / cut_of(t, param).map_or(1, |c| c.parts))
}

/// The flat range `[start, start + len)` of a slice of `numel` elements
/// that ZeRO part `shard` covers (unpadded: the last part may be shorter).
pub(crate) fn shard_range(numel: usize, shard: Option<Shard>) -> (usize, usize) {
    match shard {
        None => (0, numel),
        Some(s) => {
            let chunk = numel.div_ceil(s.parts);
            let start = (s.index * chunk).min(numel);
            (start, (numel - start).min(chunk))
        }
    }
}

/// For each rank (in program order), the pieces it writes; `slots` is the
/// optimizer's state slot count.
pub(crate) fn writes(t: &TrainingGraph, programs: &[Program], slots: usize) -> Vec<Vec<Held>> {
    let mut taken: HashSet<Held> = HashSet::new();
    let updated: HashSet<&str> = programs
        .iter()
        .flat_map(|p| &p.instructions)
        .filter_map(|i| match i {
            Instr::OptimizerStep { param, .. } => Some(param.as_str()),
            _ => None,
        })
        .collect();
    programs
        .iter()
        .map(|p| {
            let slice_index = |param: &str| slice_index(t, param, p.coord);
            let mut mine: BTreeMap<(String, Role, usize, usize), Held> = BTreeMap::new();
            let mut add = |held: Held| {
                if held.len > 0 && taken.insert(held.clone()) {
                    mine.insert((held.param.clone(), held.role, held.slice, held.start), held);
                }
            };
            for instr in &p.instructions {
                let Instr::OptimizerStep { param, shard } = instr else {
                    continue;
                };
                let Some(numel) = slice_numel(t, param) else {
                    continue;
                };
                let (start, len) = shard_range(numel, *shard);
                let slice = slice_index(param);
                let roles = std::iter::once(Role::Weight).chain((0..slots).map(Role::Slot));
                for role in roles {
                    add(Held {
                        param: param.clone(),
                        role,
                        slice,
                        start,
                        len,
                    });
                }
            }
            // Parameters no rank steps (none train today) are still saved.
            for slot in p.params.iter().filter(|s| !updated.contains(s.name.as_str())) {
                let Some(numel) = slice_numel(t, &slot.name) else {
                    continue;
                };
                let (start, len) = shard_range(numel, slot.stored_shard);
                add(Held {
                    param: slot.name.clone(),
                    role: Role::Weight,
                    slice: slice_index(&slot.name),
                    start,
                    len,
                });
            }
            mine.into_values().collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_ranges_cover_the_slice_once() {
        for (numel, parts) in [(10, 3), (4, 4), (3, 4), (0, 2)] {
            let mut next = 0;
            for index in 0..parts {
                let (start, len) = shard_range(numel, Some(Shard { index, parts }));
                if len > 0 {
                    assert_eq!(start, next);
                    next += len;
                }
            }
            assert_eq!(next, numel);
        }
        assert_eq!(shard_range(7, None), (0, 7));
    }
}
