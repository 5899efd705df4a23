//! Which ranks the simulator replays. Ranks that differ only in their
//! tensor-, context- or data-parallel coordinate run the same program up to
//! renaming their peers (same nodes, same shapes, same schedule), so their
//! timelines are identical; one representative per pipeline stage stands
//! for all of them, and a collective among ranks of one class starts as
//! soon as its representative reaches it.

use autopar_lower::{Coord, Strategy};
use std::collections::HashMap;
use std::sync::Mutex;

/// The replayed ranks and the class of every rank.
#[derive(Debug)]
pub struct Representatives {
    /// Rank replayed for each class.
    pub ranks: Vec<usize>,
    /// Ranks each class stands for.
    pub members: Vec<usize>,
    /// Class of every rank.
    class: Vec<u32>,
    /// Interned sets of classes that meet in a collective.
    groups: Mutex<HashMap<Vec<u32>, u32>>,
}

impl Representatives {
    /// Every rank replayed on its own.
    pub fn all(world: usize) -> Representatives {
        Representatives {
            ranks: (0..world).collect(),
            members: vec![1; world],
            class: (0..world as u32).collect(),
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// One rank per pipeline stage (tensor, context and data-parallel
    /// coordinate 0); the rest are symmetric to it.
    pub fn per_stage(s: &Strategy) -> Representatives {
        let ranks: Vec<usize> = (0..s.pp)
            .map(|pp| {
                s.rank_of(Coord {
                    tp: 0,
                    cp: 0,
                    dp: 0,
                    pp,
                })
            })
            .collect();
        let class = s.ranks.iter().map(|c| c.pp as u32).collect();
        Representatives {
            members: vec![s.world() / s.pp; s.pp],
            ranks,
            class,
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// Whether some class stands for more than one rank.
    pub fn reduced(&self) -> bool {
        self.members.iter().any(|&m| m > 1)
    }

    /// The class of `rank`.
    pub fn rep_of(&self, rank: usize) -> u32 {
        self.class.get(rank).copied().unwrap_or(u32::MAX)
    }

    /// An id for the classes of `ranks` (sorted, deduplicated), and how many there are.
    pub fn group_id(&self, ranks: &[usize]) -> (u32, u32) {
        let mut classes: Vec<u32> = ranks.iter().map(|&r| self.rep_of(r)).collect();
        classes.sort_unstable();
        classes.dedup();
        let size = classes.len() as u32;
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let next = groups.len() as u32;
        (*groups.entry(classes).or_insert(next), size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_class_per_stage() {
        let s = Strategy::new(2, 3, 6, 1, 4).with_tp(2, false);
        let r = Representatives::per_stage(&s);
        assert_eq!(r.ranks.len(), 3);
        assert_eq!(r.members, vec![4, 4, 4]);
        assert!(r.reduced());
        // A tensor-parallel group is one class; ranks of two stages are two.
        assert_eq!(r.group_id(&[0, 1]).1, 1);
        let (across, size) = r.group_id(&[0, s.world() - 1]);
        assert_eq!(size, 2);
        // The same classes, in any order, are the same group.
        assert_eq!(r.group_id(&[s.world() - 2, 1]), (across, 2));
        assert_ne!(r.group_id(&[0, 1]).0, across);
        assert!(!Representatives::all(4).reduced());
    }
}
