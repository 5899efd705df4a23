//! The CUDA kernel sources (`kernels/*.cu`, compiled at run time by NVRTC)
//! and the kernel names each must export under the kernel contract (each
//! `.cu` file states its launch geometry and argument conventions at its
//! top). Pure Rust and always compiled, so the executor and the tests can
//! name kernels without the `cuda` feature.

/// The shared header (`View`, `view_offset`, block reductions), prepended to
/// every source because NVRTC has no include path for it.
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// Every kernel source as (name, CUDA C++ text without [`COMMON`]).
pub const SOURCES: &[(&str, &str)] = &[
    ("elementwise", include_str!("kernels/elementwise.cu")),
    ("reduce", include_str!("kernels/reduce.cu")),
    ("gather", include_str!("kernels/gather.cu")),
    ("norm", include_str!("kernels/norm.cu")),
    ("activation", include_str!("kernels/activation.cu")),
    ("softmax", include_str!("kernels/softmax.cu")),
    ("attention", include_str!("kernels/attention.cu")),
    ("optimizer", include_str!("kernels/optimizer.cu")),
    ("conv", include_str!("kernels/conv.cu")),
];

/// Storage types, as kernel-name suffixes: `float` and `__nv_bfloat16`.
pub const DTYPES: &[&str] = &["f32", "bf16"];
/// `unary_{op}_{T}` kernels.
pub const UNARY_OPS: &[&str] = &[
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "tanh",
    "sigmoid",
    "relu",
    "abs",
    "erf",
    "sin",
    "cos",
    "identity",
];
/// `binary_{op}_{T}` kernels.
pub const BINARY_OPS: &[&str] = &["add", "sub", "mul", "div", "pow", "mod", "fmod", "max", "min"];
/// `compare_{op}_{T}` kernels (0/1 byte outputs).
pub const COMPARE_OPS: &[&str] = &["eq", "lt", "gt"];
/// `reduce_rows_{op}_{T}` kernels.
pub const REDUCE_OPS: &[&str] = &["sum", "mean", "max", "min"];

/// Largest rank a `View` describes (`MAX_RANK` in `common.cuh`).
pub const MAX_RANK: usize = 8;
/// Query rows per block of `flash_attn_fwd_*`: its grid is
/// `(ceil(Sq / FLASH_BLOCK_Q), B·Hq)` (`FLASH_BLOCK_Q` in `attention.cu`).
pub const FLASH_BLOCK_Q: u32 = 32;
/// Keys per block of `flash_attn_bwd_*`: its grid is
/// `(ceil(Sk / FLASH_BLOCK_K), B·Hq)` (`FLASH_BLOCK_K` in `attention.cu`).
pub const FLASH_BLOCK_K: u32 = 32;
/// Threads per block of both flash kernels (`FLASH_THREADS`).
pub const FLASH_THREADS: u32 = 128;
/// Largest head dimension the flash kernels accept (`FLASH_MAX_D`).
pub const FLASH_MAX_HEAD_DIM: u32 = 128;

/// A family of typed kernels: `{prefix}_{op}_{T}` for every op, or
/// `{prefix}_{T}` when `ops` is empty, for every T in [`DTYPES`].
type Family = (&'static str, &'static [&'static str]);

/// The families and the untyped kernels of one source.
fn contract(source: &str) -> Option<(&'static [Family], &'static [&'static str])> {
    const NONE: &[&str] = &[];
    Some(match source {
        "elementwise" => (
            &[
                ("copy_view", NONE),
                ("unary", UNARY_OPS),
                ("binary", BINARY_OPS),
                ("compare", COMPARE_OPS),
                ("where", NONE),
                ("fill", NONE),
                ("add_inplace", NONE),
                ("scale", NONE),
            ],
            &[
                "cast_f32_bf16",
                "cast_bf16_f32",
                "cast_i64_f32",
                "cast_f32_i64",
                "cast_bool_f32",
            ],
        ),
        "reduce" => (&[("reduce_rows", REDUCE_OPS)], NONE),
        "gather" => (
            &[
                ("gather", NONE),
                ("gather_grad", NONE),
                ("gather_elements", NONE),
                ("gather_elements_grad", NONE),
            ],
            NONE,
        ),
        "norm" => (
            &[
                ("layernorm_fwd", NONE),
                ("layernorm_bwd", NONE),
                ("rmsnorm_fwd", NONE),
                ("rmsnorm_bwd", NONE),
            ],
            NONE,
        ),
        "activation" => (
            &[
                ("gelu_fwd", NONE),
                ("gelu_bwd", NONE),
                ("silu_fwd", NONE),
                ("silu_bwd", NONE),
            ],
            NONE,
        ),
        "softmax" => (
            &[
                ("softmax_fwd", NONE),
                ("softmax_bwd", NONE),
                ("cross_entropy_fwd", NONE),
                ("cross_entropy_bwd", NONE),
            ],
            NONE,
        ),
        "attention" => (
            &[
                ("flash_attn_fwd", NONE),
                ("flash_attn_bwd_pre", NONE),
                ("flash_attn_bwd", NONE),
            ],
            NONE,
        ),
        "optimizer" => (&[("adamw", NONE), ("sgd", NONE)], NONE),
        "conv" => (
            &[
                ("im2col", NONE),
                ("col2im", NONE),
                ("channel_bias", NONE),
                ("max_pool_fwd", NONE),
                ("avg_pool_fwd", NONE),
                ("max_pool_bwd", NONE),
                ("avg_pool_bwd", NONE),
            ],
            NONE,
        ),
        _ => return None,
    })
}

/// The text NVRTC compiles for source `name`: [`COMMON`] followed by the
/// source, or `None` for a name not in [`SOURCES`].
pub fn full_source(name: &str) -> Option<String> {
    let (_, text) = SOURCES.iter().find(|(n, _)| *n == name)?;
    Some(format!("{COMMON}\n// ---- {name}.cu ----\n{text}"))
}

/// Every kernel that source `source` must export under the contract (empty
/// for an unknown source), so tests can check that none is missing.
pub fn kernel_names(source: &str) -> Vec<String> {
    let Some((families, untyped)) = contract(source) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for &(prefix, ops) in families {
        if ops.is_empty() {
            names.extend(DTYPES.iter().map(|t| format!("{prefix}_{t}")));
        }
        for op in ops {
            names.extend(DTYPES.iter().map(|t| format!("{prefix}_{op}_{t}")));
        }
    }
    names.extend(untyped.iter().map(|s| s.to_string()));
    names
}

/// The source that exports kernel `kernel`, if any.
pub fn source_of(kernel: &str) -> Option<&'static str> {
    SOURCES
        .iter()
        .map(|(name, _)| *name)
        .find(|name| kernel_names(name).iter().any(|k| k == kernel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_families_expand_per_dtype_and_untyped_kernels_once() {
        assert_eq!(
            kernel_names("reduce"),
            [
                "reduce_rows_sum_f32",
                "reduce_rows_sum_bf16",
                "reduce_rows_mean_f32",
                "reduce_rows_mean_bf16",
                "reduce_rows_max_f32",
                "reduce_rows_max_bf16",
                "reduce_rows_min_f32",
                "reduce_rows_min_bf16",
            ]
        );
        let elementwise = kernel_names("elementwise");
        assert!(elementwise.contains(&"unary_rsqrt_bf16".to_string()));
        assert!(elementwise.contains(&"compare_gt_f32".to_string()));
        assert!(elementwise.contains(&"cast_bool_f32".to_string()));
        assert!(!elementwise.contains(&"cast_bool_f32_f32".to_string()));
        assert!(elementwise.contains(&"binary_mod_bf16".to_string()));
        assert!(elementwise.contains(&"binary_fmod_f32".to_string()));
        // copy_view, 14 unary, 9 binary, 3 compare, where, fill, add_inplace,
        // scale: 31 typed kernels per dtype, plus 5 casts.
        assert_eq!(elementwise.len(), 31 * 2 + 5);
    }

    #[test]
    fn every_source_has_kernels_and_no_name_is_exported_twice() {
        let mut all: Vec<String> = SOURCES.iter().flat_map(|(name, _)| kernel_names(name)).collect();
        assert!(SOURCES.iter().all(|(name, _)| !kernel_names(name).is_empty()));
        let total = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), total);
        assert!(kernel_names("nope").is_empty());
        assert!(full_source("nope").is_none());
    }

    #[test]
    fn full_source_starts_with_the_common_header() {
        let text = full_source("softmax").unwrap();
        assert!(text.starts_with(COMMON));
        assert!(text.contains("softmax_fwd"));
        assert_eq!(source_of("flash_attn_bwd_pre_bf16"), Some("attention"));
        assert_eq!(source_of("cast_i64_f32"), Some("elementwise"));
        assert_eq!(source_of("nope_f32"), None);
    }

    #[test]
    fn rust_constants_match_the_cuda_defines() {
        assert!(COMMON.contains(&format!("#define MAX_RANK {MAX_RANK}\n")));
        let attention = SOURCES.iter().find(|(n, _)| *n == "attention").unwrap().1;
        for (define, value) in [
            ("FLASH_BLOCK_Q", FLASH_BLOCK_Q),
            ("FLASH_BLOCK_K", FLASH_BLOCK_K),
            ("FLASH_THREADS", FLASH_THREADS),
            ("FLASH_MAX_D", FLASH_MAX_HEAD_DIM),
        ] {
            assert!(
                attention.contains(&format!("#define {define} {value}\n")),
                "attention.cu must define {define} as {value}"
            );
        }
    }
}
