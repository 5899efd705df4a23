//! Buffer lifetimes: where each micro-batch buffer (and gathered
//! parameter) is defined and last used, and the program with a `Free`
//! after each definition's last use.

use super::Emitter;
use crate::program::{Buf, Instr};

/// A buffer without its name: the tensor standing for its name
/// ([`Layout::name_of`]), and its micro-batch plus one (0: a per-step buffer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Key {
    pub name: u32,
    pub mb: usize,
}

/// Marks an empty slot of [`Lifetimes`]' tables.
pub(super) const NONE: usize = usize::MAX;

/// Where each buffer is defined and last used, noted as instructions are
/// emitted, so that every definition can be freed after its last use.
/// Buffers of one name are a row indexed by [`Key::mb`]: a rank defines
/// every micro-batch's buffer of the tensors it computes.
#[derive(Default)]
pub(super) struct Lifetimes {
    /// By name: its row in `rows`, or NONE.
    row_of: Vec<usize>,
    /// Names seen so far, each with the instruction that last defined each
    /// of its buffers (NONE: never).
    rows: Vec<(u32, Vec<usize>)>,
    /// By defining instruction: the last instruction using any buffer it
    /// defined (0: none yet).
    last_use: Vec<usize>,
    /// `(instruction, buffer)`: free `buffer` after `instruction`.
    frees: Vec<(usize, Key)>,
}

impl Lifetimes {
    /// The instruction that last defined `key`.
    pub(super) fn def(&self, key: Key) -> Option<usize> {
        let &row = self.row_of.get(key.name as usize)?;
        let &def = self.rows.get(row)?.1.get(key.mb)?;
        (def != NONE).then_some(def)
    }

    pub(super) fn is_defined(&self, key: Key) -> bool {
        self.def(key).is_some()
    }

    /// Instruction `at` reads `key` (if defined).
    pub(super) fn used(&mut self, key: Key, at: usize) {
        if let Some(def) = self.def(key) {
            if self.last_use.len() <= def {
                self.last_use.resize(def + 1, 0);
            }
            self.last_use[def] = at;
        }
    }

    /// Instruction `at` (re)defines `key`: its previous definition is freed
    /// after that one's last use.
    pub(super) fn defined(&mut self, key: Key, at: usize) {
        let prev = std::mem::replace(self.slot(key), at);
        if prev != NONE {
            self.frees.push((self.free_after(prev), key));
        }
    }

    /// `key`'s definition slot, made if new.
    pub(super) fn slot(&mut self, key: Key) -> &mut usize {
        let name = key.name as usize;
        if self.row_of.len() <= name {
            self.row_of.resize(name + 1, NONE);
        }
        if self.row_of[name] == NONE {
            self.row_of[name] = self.rows.len();
            self.rows.push((key.name, Vec::new()));
        }
        let row = &mut self.rows[self.row_of[name]].1;
        if row.len() <= key.mb {
            row.resize(key.mb + 1, NONE);
        }
        &mut row[key.mb]
    }

    pub(super) fn free_after(&self, def: usize) -> usize {
        self.last_use.get(def).copied().unwrap_or(0).max(def)
    }

    /// Every free, the last definitions' included, grouped by the
    /// instruction (below `instructions`) to free after, each group in the
    /// order of the buffers' names (`name` of a key) and micro-batches.
    pub(super) fn into_frees<'n>(
        mut self,
        instructions: usize,
        name: impl Fn(u32) -> &'n str,
    ) -> Groups<Key> {
        for (tensor, defs) in &self.rows {
            for (mb, &def) in defs.iter().enumerate() {
                if def != NONE {
                    let free = self.free_after(def);
                    self.frees.push((free, Key { name: *tensor, mb }));
                }
            }
        }
        let mut by_name: Vec<usize> = (0..self.rows.len()).collect();
        by_name.sort_unstable_by_key(|&row| name(self.rows[row].0));
        let mut rank = vec![0; self.rows.len()];
        for (i, &row) in by_name.iter().enumerate() {
            rank[row] = i;
        }
        let mut frees = Groups::new(instructions, &self.frees);
        for i in 0..instructions {
            frees
                .get_mut(i)
                .sort_unstable_by_key(|key| (rank[self.row_of[key.name as usize]], key.mb));
        }
        frees
    }
}

/// Values grouped by an index below a bound, each group in the values'
/// order (a counting sort): group `k` is `values[start[k]..start[k + 1]]`.
pub(super) struct Groups<T> {
    start: Vec<usize>,
    values: Vec<T>,
}

impl<T: Copy + Default> Groups<T> {
    /// Groups the values of `(index, value)` pairs; indices of `groups`
    /// and above are dropped.
    pub(super) fn new(groups: usize, items: &[(usize, T)]) -> Groups<T> {
        let mut start = vec![0; groups + 1];
        for &(k, _) in items.iter().filter(|&&(k, _)| k < groups) {
            start[k + 1] += 1;
        }
        for k in 0..groups {
            start[k + 1] += start[k];
        }
        let mut next = start.clone();
        let mut values = vec![T::default(); start[groups]];
        for &(k, value) in items.iter().filter(|&&(k, _)| k < groups) {
            values[next[k]] = value;
            next[k] += 1;
        }
        Groups { start, values }
    }

    pub(super) fn range(&self, k: usize) -> std::ops::Range<usize> {
        match self.start.get(k..k + 2) {
            Some(&[from, to]) => from..to,
            _ => 0..0,
        }
    }

    pub(super) fn get(&self, k: usize) -> &[T] {
        &self.values[self.range(k)]
    }

    pub(super) fn get_mut(&mut self, k: usize) -> &mut [T] {
        let range = self.range(k);
        &mut self.values[range]
    }
}

impl Emitter<'_, '_> {
    /// The instructions with a `Free` after the last use of every
    /// definition of a micro-batch buffer (and of gathered parameters), so
    /// the program itself states each buffer's lifetime.
    pub(super) fn with_frees(self) -> Vec<Instr> {
        let l = self.l;
        let mut out = self.out;
        let emitted = out.len();
        let frees = self.lifetimes.into_frees(emitted, |name| l.name(name));
        // Spread the instructions in place from the back, filling the gaps
        // with the frees; `next` is the slot filled last.
        let mut next = emitted + frees.values.len();
        out.resize_with(next, || Instr::Free { buf: Buf::step("") });
        for i in (0..emitted).rev() {
            for key in frees.get(i).iter().rev() {
                next -= 1;
                let buf = Buf {
                    tensor: l.name(key.name).to_string(),
                    micro_batch: key.mb.checked_sub(1),
                };
                out[next] = Instr::Free { buf };
            }
            next -= 1;
            out.swap(i, next);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_keep_each_index_s_values_in_order() {
        let groups = Groups::new(3, &[(2, 'a'), (0, 'b'), (2, 'c'), (5, 'd')]);
        assert_eq!(groups.get(0), ['b']);
        assert_eq!(groups.get(1), [] as [char; 0]);
        assert_eq!(groups.get(2), ['a', 'c']);
        assert_eq!(groups.get(3), [] as [char; 0]);
    }

    #[test]
    fn each_definition_is_freed_after_the_last_use_of_its_instruction_s_buffers() {
        let key = |name, mb| Key { name, mb };
        let (a, b, c) = (key(1, 1), key(2, 1), key(3, 1));
        let mut l = Lifetimes::default();
        l.defined(a, 0);
        l.used(a, 1);
        // Instruction 1 defines b and c; only b is read, at 2.
        l.defined(b, 1);
        l.defined(c, 1);
        l.used(b, 2);
        // a again (a recomputation), read at 4; a per-step buffer never read.
        l.defined(a, 3);
        l.used(a, 4);
        l.defined(key(1, 0), 5);
        assert!(l.is_defined(a) && !l.is_defined(key(1, 2)));
        let names = ["", "x", "w", "v"];
        let frees = l.into_frees(6, |name| names[name as usize]);
        let expected: [&[Key]; 6] = [&[], &[a], &[c, b], &[], &[a], &[key(1, 0)]];
        for (i, keys) in expected.iter().enumerate() {
            assert_eq!(frees.get(i), *keys, "after instruction {i}");
        }
    }
}
