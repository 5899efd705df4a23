//! Counter-based pseudo-random numbers: every draw is a pure function of a
//! key and an index, so a value never depends on how many draws came before
//! it. That is what makes data rows independent of how ranks split a batch
//! and initial weights independent of graph order. The mixer is SplitMix64's
//! finaliser (Steele et al., "Fast splittable pseudorandom number
//! generators", 2014); it is written here rather than taken from `rand`
//! because its values are part of the runtime's contract and must not move
//! with a dependency's version.

/// SplitMix64's output function: a bijective 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stream key derived from a list of integers (seed, step, row...).
pub fn key(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6a09_e667_f3bc_c908, |h, &p| mix(h ^ mix(p)))
}

/// A stream key for a name (FNV-1a over its bytes, then mixed with `seed`).
pub fn name_key(seed: u64, name: &str) -> u64 {
    let fnv = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    key(&[seed, fnv])
}

/// Draw `i` of stream `key`: 64 uniform bits.
pub fn bits(key: u64, i: u64) -> u64 {
    mix(key ^ mix(i))
}

/// Draw `i` of stream `key` as an integer uniform in `0..n` (Lemire's
/// multiply-shift; its bias is below n/2⁶⁴). `n` must be positive.
pub fn below(key: u64, i: u64, n: u64) -> u64 {
    ((u128::from(bits(key, i)) * u128::from(n)) >> 64) as u64
}

/// Element `i` of stream `key` drawn from the standard normal distribution
/// (Box–Muller on draws `2i` and `2i + 1`).
pub fn normal(key: u64, i: u64) -> f64 {
    let unit = |j: u64| ((bits(key, j) >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let (u1, u2) = (unit(2 * i), unit(2 * i + 1));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_their_parts() {
        assert_ne!(key(&[1, 2]), key(&[2, 1]));
        assert_ne!(key(&[0]), key(&[0, 0]));
        assert_ne!(
            name_key(0, "h.0.attn.qkv.weight"),
            name_key(0, "h.1.attn.qkv.weight")
        );
        assert_ne!(name_key(0, "wte.weight"), name_key(1, "wte.weight"));
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let k = key(&[7]);
        let draws: Vec<u64> = (0..1000).map(|i| below(k, i, 5)).collect();
        assert!(draws.iter().all(|&d| d < 5));
        for v in 0..5 {
            assert!(draws.contains(&v), "value {v} never drawn");
        }
    }

    #[test]
    fn normal_has_unit_moments() {
        let k = key(&[3]);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|i| normal(k, i)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
        assert!(xs.iter().all(|x| x.is_finite()));
    }
}
