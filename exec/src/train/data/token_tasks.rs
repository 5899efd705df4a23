//! The rows of the token objectives, each made from one window of a token
//! stream ([`TokenSource::sequence`]):
//!
//! - lm: `seq + 1` tokens; the first `seq` are the inputs, the last `seq`
//!   the targets.
//! - seq2seq: `source + target` tokens; the source is the first `source`,
//!   the target the rest (the source continued), and the decoder reads the
//!   target shifted right by one, its first token the source's last (as a
//!   start token). On synthetic progressions the continuation is learnable
//!   from the decoder's own prefix and, through cross-attention, from the
//!   source.
//! - mlm: `seq` tokens, `masked` of them (at positions drawn from
//!   `(seed, step, row)`) replaced by the mask token in the input; the
//!   targets are the original tokens and the loss weighs only the masked
//!   positions. A fixed count per row keeps the loss's denominator known
//!   before the data is seen, so micro-batch losses add up to the global
//!   mean. Every masked token is replaced (BERT also keeps or randomises
//!   a fifth of them).

use super::{DataError, TokenSource, Values};
use crate::train::random;
use autopar_lower::{Feed, Task};

/// Separates the masked positions' stream from the rows' own.
const MASK_STREAM: u64 = 0x006d_6c6d;

/// The window length a token file must hold at least once for `task`,
/// minus one (the `seq` of [`TokenSource::open`]).
pub(super) fn window(task: &Task) -> usize {
    match task {
        Task::Lm { seq, .. } => *seq,
        Task::Seq2Seq { source, target, .. } => source + target - 1,
        Task::Mlm { seq, .. } => seq - 1,
        Task::Classify { .. } | Task::Regress { .. } => 0,
    }
}

/// Row `row` of step `step` of the input fed with `feed`.
pub(super) fn row(
    source: &TokenSource,
    task: &Task,
    feed: Feed,
    step: u64,
    row: usize,
) -> Result<Values, DataError> {
    let w = source.sequence(step, row, window(task))?;
    let ints = |range: std::ops::Range<usize>| Ok(Values::Ints(w[range].to_vec()));
    match (task, feed) {
        (Task::Lm { seq, .. }, Feed::Tokens) => ints(0..*seq),
        (Task::Lm { seq, .. }, Feed::Targets) => ints(1..seq + 1),
        (Task::Seq2Seq { source, .. }, Feed::Tokens) => ints(0..*source),
        (Task::Seq2Seq { source, target, .. }, Feed::DecoderTokens) => ints(source - 1..source - 1 + target),
        (Task::Seq2Seq { source, target, .. }, Feed::Targets) => ints(*source..source + target),
        (
            Task::Mlm {
                seq,
                masked,
                mask_token,
                ..
            },
            Feed::Tokens | Feed::Masked,
        ) => {
            let at = masked_positions(source.seed(), step, row, *seq, *masked);
            Ok(match feed {
                Feed::Tokens => {
                    let mut tokens = w;
                    at.iter().for_each(|&p| tokens[p] = *mask_token);
                    Values::Ints(tokens)
                }
                _ => {
                    let mut weights = vec![0.0; *seq];
                    at.iter().for_each(|&p| weights[p] = 1.0);
                    Values::Floats(weights)
                }
            })
        }
        (Task::Mlm { seq, .. }, Feed::Targets) => ints(0..*seq),
        _ => Err(DataError::WrongData {
            objective: task.objective(),
            data: "a token stream",
        }),
    }
}

/// `masked` distinct positions of `0..seq`, drawn from `(seed, step, row)`
/// (a partial Fisher–Yates shuffle).
fn masked_positions(seed: u64, step: u64, row: usize, seq: usize, masked: usize) -> Vec<usize> {
    let key = random::key(&[seed, step, row as u64, MASK_STREAM]);
    let mut order: Vec<usize> = (0..seq).collect();
    for i in 0..masked.min(seq) {
        let j = i + random::below(key, i as u64, (seq - i) as u64) as usize;
        order.swap(i, j);
    }
    order.truncate(masked);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(task: &Task, feed: Feed) -> Vec<Values> {
        let source = TokenSource::synthetic(32, 4);
        (0..6).map(|r| row(&source, task, feed, 2, r).unwrap()).collect()
    }

    fn ints(v: &Values) -> &[i64] {
        match v {
            Values::Ints(v) => v,
            Values::Floats(_) => panic!("reals"),
        }
    }

    #[test]
    fn seq2seq_decoder_reads_the_targets_shifted_right() {
        let task = Task::Seq2Seq {
            source: 5,
            target: 4,
            vocab: 32,
        };
        let (src, dec, tgt) = (
            rows(&task, Feed::Tokens),
            rows(&task, Feed::DecoderTokens),
            rows(&task, Feed::Targets),
        );
        for r in 0..6 {
            let (s, d, t) = (ints(&src[r]), ints(&dec[r]), ints(&tgt[r]));
            assert_eq!((s.len(), d.len(), t.len()), (5, 4, 4));
            assert_eq!(d[0], s[4], "the decoder starts from the source's last token");
            assert_eq!(d[1..], t[..3], "teacher forcing");
            // The target continues the source's progression.
            let stride = (s[1] - s[0]).rem_euclid(16);
            assert_eq!(t[0], (s[4] + stride) % 16, "row {r}: {s:?} → {t:?}");
        }
    }

    #[test]
    fn mlm_masks_a_fixed_count_where_its_weights_say() {
        let task = Task::Mlm {
            seq: 10,
            vocab: 32,
            masked: 3,
            mask_token: 31,
        };
        let (input, weights, targets) = (
            rows(&task, Feed::Tokens),
            rows(&task, Feed::Masked),
            rows(&task, Feed::Targets),
        );
        let mut patterns = std::collections::BTreeSet::new();
        for r in 0..6 {
            let Values::Floats(w) = &weights[r] else {
                panic!("integer weights")
            };
            let (x, t) = (ints(&input[r]), ints(&targets[r]));
            assert_eq!(w.iter().filter(|&&w| w == 1.0).count(), 3);
            for p in 0..10 {
                match w[p] == 1.0 {
                    true => assert_eq!(x[p], 31),
                    false => assert_eq!((w[p], x[p]), (0.0, t[p])),
                }
            }
            patterns.insert(format!("{w:?}"));
        }
        assert!(patterns.len() > 1, "every row masks the same positions");
        assert_eq!(
            rows(&task, Feed::Masked),
            weights,
            "masks depend only on (seed, step, row)"
        );
    }

    #[test]
    fn lm_targets_are_the_next_tokens() {
        let task = Task::Lm { seq: 6, vocab: 32 };
        let (x, t) = (rows(&task, Feed::Tokens), rows(&task, Feed::Targets));
        for r in 0..6 {
            assert_eq!(ints(&x[r])[1..], ints(&t[r])[..5]);
        }
    }
}
