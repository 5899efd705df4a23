use super::super::sharding::{strategies, Layout};
use super::super::testing::*;
use super::super::Op;
use super::*;
use crate::DType;

fn conv(strides: &[usize], pads: &[usize], groups: usize) -> Op {
    Op::Conv {
        window: Window {
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: vec![1; strides.len()],
        },
        groups,
    }
}

#[test]
fn conv_sums_each_window_and_adds_the_bias() {
    // 1×1×3×3 input, one 2×2 filter of ones, bias 10, stride 1, no pads.
    let x = f32s(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let w = f32s(&[1, 1, 2, 2], &[1.; 4]);
    let b = f32s(&[1], &[10.]);
    let (shape, y) = eval1(&conv(&[1, 1], &[0; 4], 1), &[&x, &w, &b]);
    assert_eq!(shape, vec![1, 1, 2, 2]);
    assert_eq!(y, vec![22., 26., 34., 38.]);
    // Padded by one on every side with stride 2: corners see one element each… and more.
    let (shape, y) = eval1(&conv(&[2, 2], &[1; 4], 1), &[&x, &w]);
    assert_eq!(shape, vec![1, 1, 2, 2]);
    assert_eq!(y, vec![1., 5., 11., 28.]);
}

#[test]
fn transposed_conv_spreads_each_input_over_its_window() {
    let op = Op::ConvTranspose {
        window: Window::plain(1),
        groups: 1,
        output_padding: vec![0],
    };
    let x = f32s(&[1, 1, 2], &[1., 10.]);
    let w = f32s(&[1, 1, 3], &[1., 2., 3.]);
    let (shape, y) = eval1(&op, &[&x, &w]);
    assert_eq!(shape, vec![1, 1, 4]);
    assert_eq!(y, vec![1., 12., 23., 30.]);
}

#[test]
fn pools_take_the_max_or_the_mean_of_each_window() {
    let x = f32s(&[1, 1, 2, 3], &[1., 5., 2., 4., 3., 6.]);
    let pool = |kind| Op::Pool {
        kind,
        kernel: vec![2, 2],
        window: Window {
            strides: vec![1, 1],
            pads: vec![0, 0, 0, 1],
            dilations: vec![1, 1],
        },
        ceil_mode: false,
    };
    assert_eq!(eval1(&pool(PoolKind::Max), &[&x]).1, vec![5., 6., 6.]);
    let exclude = PoolKind::Average {
        count_include_pad: false,
    };
    assert_eq!(eval1(&pool(exclude), &[&x]).1, vec![3.25, 4., 4.]);
    let include = PoolKind::Average {
        count_include_pad: true,
    };
    assert_eq!(eval1(&pool(include), &[&x]).1, vec![3.25, 4., 2.]);
}

#[test]
fn shapes_keep_a_symbolic_batch_and_reject_mismatched_weights() {
    let op = conv(&[2, 2], &[1; 4], 1);
    let out = infer(&op, &[ty(DType::F32, "b 3 32 32"), ty(DType::F32, "8 3 3 3")]).unwrap();
    assert_eq!(out, vec![ty(DType::F32, "b 8 16 16")]);
    assert_op_err(
        infer(&op, &[ty(DType::F32, "b 4 32 32"), ty(DType::F32, "8 3 3 3")]),
        "Conv",
        "does not fit 4 input channels",
    );
    assert_op_err(
        infer(
            &conv(&[1], &[0, 0], 1),
            &[ty(DType::F32, "b 3 2"), ty(DType::F32, "8 3 3")],
        ),
        "Conv",
        "the kernel does not fit",
    );
    assert_op_err(
        infer(
            &conv(&[1], &[0, 0], 1),
            &[ty(DType::F32, "b 3 s"), ty(DType::F32, "8 3 3")],
        ),
        "Conv",
        "must be known",
    );
}

#[test]
fn convolutions_split_by_samples_filters_channels_or_groups() {
    let op = conv(&[1, 1], &[0; 4], 1);
    let v = view(&[&[4, 6, 8, 8], &[4, 6, 3, 3], &[4]], &[&[4, 4, 6, 6]], 2);
    let all = strategies(&op, &v);
    assert_eq!(names(&all), vec!["replicate", "batch", "filters"]);
    assert_eq!(find(&all, "filters").inputs[1], Some(Layout::Shard(0)));
    let no_bias = view(&[&[4, 6, 8, 8], &[4, 6, 3, 3]], &[&[4, 4, 6, 6]], 2);
    let channels = strategies(&op, &no_bias);
    assert_eq!(find(&channels, "channels").outputs, vec![Layout::Partial]);
    let depthwise = conv(&[1, 1], &[0; 4], 6);
    let v = view(&[&[4, 6, 8, 8], &[6, 1, 3, 3]], &[&[4, 6, 6, 6]], 2);
    let all = strategies(&depthwise, &v);
    assert_eq!(
        layouts(&[find(&all, "groups").clone()]),
        vec![("groups", Some(Layout::Shard(1)), Layout::Shard(1))]
    );
}
