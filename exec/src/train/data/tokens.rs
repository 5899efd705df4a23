//! Token streams: synthetic progressions or a token file, each row a
//! window of consecutive tokens drawn from `(seed, step, row)`. What a
//! token objective makes of a window is [`super::token_tasks`]'.

use super::DataError;
use crate::train::random;
use std::path::{Path, PathBuf};

/// Strides of the synthetic progressions (see [`TokenSource::Synthetic`]).
const STRIDES: [u64; 4] = [1, 2, 3, 4];
/// Most tokens the synthetic progressions run over.
const ALPHABET: usize = 16;

/// Where training tokens come from.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenSource {
    /// Learnable synthetic text: each row is an arithmetic progression over
    /// the first `a = min(vocab, 16)` tokens, `t_k = (start + k·stride) mod a`,
    /// with `start` uniform over them and `stride` uniform over {1, 2, 3, 4},
    /// both drawn from `(seed, step, row)`. A model learns it in stages, each
    /// visible in the loss: the small alphabet (ln vocab → ln 16), the bigram
    /// (the next token is one of four: → ln 4), then, through attention, its
    /// row's stride (after two tokens the rest is determined: → 0). The
    /// alphabet is kept small because a progression over the whole
    /// vocabulary is a separate fact per token, too many to show in a few
    /// steps: a 2-layer, 64-wide GPT over 128 tokens (batch 8, seq 16, AdamW
    /// at 3e-3) goes from a loss of 4.85 at step 1 to 4.20 at step 10 on
    /// these rows, but only to 4.80 on progressions over all 128 tokens.
    Synthetic { vocab: usize, seed: u64 },
    /// Tokens read from a file; each row is a window of `seq + 1`
    /// consecutive tokens starting at a position drawn from
    /// `(seed, step, row)`, as nanoGPT samples its batches.
    File {
        path: PathBuf,
        tokens: Vec<u32>,
        seed: u64,
    },
}

impl TokenSource {
    /// Synthetic progressions over `vocab` tokens (see [`TokenSource::Synthetic`]).
    pub fn synthetic(vocab: usize, seed: u64) -> Self {
        TokenSource::Synthetic { vocab, seed }
    }

    /// Loads `path`: raw little-endian `uint16` tokens, nanoGPT's
    /// `train.bin` format. Checks up front what would otherwise fail mid-run:
    /// the file holds at least one window of `seq + 1` tokens and every
    /// token is below `vocab` (an embedding lookup would fail on it).
    pub fn open(path: &Path, vocab: usize, seq: usize, seed: u64) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        if bytes.len() % 2 != 0 {
            return Err(DataError::OddBytes {
                path: path.to_path_buf(),
                bytes: bytes.len(),
            });
        }
        let tokens: Vec<u32> = bytes
            .chunks_exact(2)
            .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
            .collect();
        if let Some((index, &token)) = tokens.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
            return Err(DataError::TokenOutOfRange {
                path: path.to_path_buf(),
                index,
                token,
                vocab,
            });
        }
        let source = TokenSource::File {
            path: path.to_path_buf(),
            tokens,
            seed,
        };
        source.sequence(0, 0, seq)?;
        Ok(source)
    }

    /// The seed its rows are drawn from.
    pub fn seed(&self) -> u64 {
        match self {
            TokenSource::Synthetic { seed, .. } | TokenSource::File { seed, .. } => *seed,
        }
    }

    /// Row `row` of the global batch of `step`: `seq + 1` consecutive
    /// tokens (next-token prediction reads the first `seq` and predicts
    /// the last `seq`).
    pub fn sequence(&self, step: u64, row: usize, seq: usize) -> Result<Vec<i64>, DataError> {
        match self {
            TokenSource::Synthetic { vocab, seed } => {
                let a = (*vocab).min(ALPHABET) as u64;
                if a == 0 {
                    return Err(DataError::EmptyVocab);
                }
                let key = random::key(&[*seed, step, row as u64]);
                let start = random::below(key, 0, a);
                let stride = STRIDES[random::below(key, 1, STRIDES.len() as u64) as usize];
                Ok((0..=seq as u64)
                    .map(|k| ((start + (k % a) * stride) % a) as i64)
                    .collect())
            }
            TokenSource::File { path, tokens, seed } => {
                let starts =
                    tokens
                        .len()
                        .checked_sub(seq)
                        .filter(|&n| n > 0)
                        .ok_or_else(|| DataError::TooShort {
                            path: path.clone(),
                            tokens: tokens.len(),
                            seq,
                        })?;
                let key = random::key(&[*seed, step, row as u64]);
                let start = random::below(key, 0, starts as u64) as usize;
                Ok(tokens[start..=start + seq]
                    .iter()
                    .map(|&t| i64::from(t))
                    .collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token file holding `tokens`, in a temporary directory kept alive by the guard.
    fn token_file(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.bin");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn le(tokens: &[u16]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    #[test]
    fn synthetic_rows_are_progressions_over_a_small_alphabet() {
        // (vocab, alphabet): small vocabularies use all their tokens.
        for (vocab, a) in [(11, 11), (128, 16)] {
            let source = TokenSource::synthetic(vocab, 5);
            let mut strides = std::collections::BTreeSet::new();
            for row in 0..40 {
                let s = source.sequence(3, row, 30).unwrap();
                assert_eq!(s.len(), 31);
                let stride = (s[1] - s[0]).rem_euclid(a);
                for k in 1..s.len() {
                    assert_eq!(s[k], (s[k - 1] + stride) % a, "row {row}: {s:?}");
                }
                strides.insert(stride);
            }
            assert_eq!(
                strides.into_iter().collect::<Vec<_>>(),
                [1, 2, 3, 4],
                "vocab {vocab}"
            );
        }
    }

    #[test]
    fn rows_depend_only_on_seed_step_and_row() {
        let batch = |seed, step| -> Vec<Vec<i64>> {
            let source = TokenSource::synthetic(100, seed);
            (0..20)
                .map(|row| source.sequence(step, row, 8).unwrap())
                .collect()
        };
        assert_eq!(batch(1, 2), batch(1, 2));
        assert_ne!(batch(1, 2), batch(1, 3));
        assert_ne!(batch(1, 2), batch(2, 2));
        let rows = batch(1, 2);
        assert!(rows.windows(2).any(|w| w[0] != w[1]), "every row alike: {rows:?}");
    }

    #[test]
    fn file_rows_are_windows_of_the_file() {
        let tokens: Vec<u16> = (0..50).map(|i| (i * 7 % 64) as u16).collect();
        let (_dir, path) = token_file(&le(&tokens));
        let source = TokenSource::open(&path, 64, 8, 9).unwrap();
        let mut starts = std::collections::BTreeSet::new();
        for row in 0..40 {
            let s = source.sequence(1, row, 8).unwrap();
            let start = tokens.iter().position(|&t| i64::from(t) == s[0]).unwrap();
            let window: Vec<i64> = tokens[start..start + 9].iter().map(|&t| i64::from(t)).collect();
            assert_eq!(s, window);
            starts.insert(start);
        }
        assert!(starts.len() > 10, "windows barely vary: {starts:?}");
        assert_eq!(
            source.sequence(1, 3, 8).unwrap(),
            source.sequence(1, 3, 8).unwrap()
        );
    }

    #[test]
    fn a_file_of_exactly_one_window_serves_it() {
        let (_dir, path) = token_file(&le(&[1, 2, 3]));
        let source = TokenSource::open(&path, 4, 2, 0).unwrap();
        assert_eq!(source.sequence(5, 5, 2).unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn bad_files_are_named_in_errors() {
        let (_dir, path) = token_file(&[1, 0, 2]);
        let shown = path.display().to_string();
        let message = |bytes: &[u8], vocab, seq| {
            std::fs::write(&path, bytes).unwrap();
            TokenSource::open(&path, vocab, seq, 0).unwrap_err().to_string()
        };
        assert_eq!(
            message(&[1, 0, 2], 10, 1),
            format!("token file {shown} has 3 bytes, not a whole number of uint16 tokens")
        );
        assert_eq!(
            message(&le(&[1, 2, 3]), 10, 3),
            format!("token file {shown} has 3 tokens, fewer than seq + 1 = 4")
        );
        assert_eq!(
            message(&le(&[1, 2, 300, 4]), 256, 1),
            format!("token file {shown}: token 2 is 300, not below the vocabulary size 256")
        );
        let missing = path.with_file_name("absent.bin");
        let err = TokenSource::open(&missing, 10, 1, 0).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("cannot read token file {}: ", missing.display())),
            "{err}"
        );
    }

    #[test]
    fn empty_synthetic_vocab_is_an_error() {
        let err = TokenSource::synthetic(0, 0).sequence(0, 0, 4).unwrap_err();
        assert!(matches!(err, DataError::EmptyVocab));
    }
}
