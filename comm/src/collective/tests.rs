//! Collectives on real rank threads, checked against direct computation and
//! against the communication model's bytes per rank.

use super::*;
use crate::launch::LaunchEnv;
use autopar_cost_models::comm::bytes_sent;
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// The groups every collective is tried on (world of 4): sizes 1 to 4, one
/// of them non-contiguous and one not starting at rank 0.
const GROUPS: [&[usize]; 6] = [&[0], &[2], &[0, 1], &[1, 3], &[0, 2, 3], &[0, 1, 2, 3]];
const WORLD: usize = 4;

/// Where the ranks of a test fabric live.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Threads sharing mailboxes.
    InProcess,
    /// A TCP mesh on loopback, each rank connected as its own process would.
    Tcp,
}

/// The `world` ranks of a TCP mesh on loopback, connected from one thread
/// each, as separate processes would connect.
pub(crate) fn tcp_fabric(world: usize, timeout: Duration) -> Vec<Endpoint> {
    let port = crate::launch::free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let env = LaunchEnv::loopback(rank, world, port);
                s.spawn(move || connect(&env, Duration::from_secs(10), timeout))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().expect("a TCP mesh on loopback"))
            .collect()
    })
}

/// Runs `f` on every rank of a fresh fabric of `kind`, one thread each;
/// ranks outside `group` only close their endpoint. Returns each member's
/// result and bytes sent, in group order.
fn run_on<T: Send>(
    kind: Kind,
    group: &[usize],
    timeout: Duration,
    f: impl Fn(&Endpoint, usize) -> T + Sync,
) -> Vec<(T, u64)> {
    let endpoints = match kind {
        Kind::InProcess => fabric(WORLD, timeout),
        Kind::Tcp => tcp_fabric(WORLD, timeout),
    };
    let mut out: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = endpoints
            .iter()
            .map(|ep| {
                let pos = group.iter().position(|&r| r == ep.rank());
                let f = &f;
                s.spawn(move || {
                    let result = pos.map(|pos| (pos, (f(ep, pos), ep.bytes_sent())));
                    // Closing fails only where a rank aborted the fabric.
                    if let Err(e) = ep.close(long()) {
                        assert!(matches!(e, CommError::Aborted { .. }), "{e}");
                    }
                    result
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().unwrap()).collect()
    });
    out.sort_by_key(|(pos, _)| *pos);
    out.into_iter().map(|(_, r)| r).collect()
}

/// [`run_on`] both fabrics, which must agree on every result and byte count.
fn run<T: Send + PartialEq + Debug>(
    group: &[usize],
    timeout: Duration,
    f: impl Fn(&Endpoint, usize) -> T + Sync,
) -> Vec<(T, u64)> {
    let here = run_on(Kind::InProcess, group, timeout, &f);
    let tcp = run_on(Kind::Tcp, group, timeout, &f);
    assert_eq!(here, tcp, "the in-process and TCP fabrics disagree");
    here
}

fn long() -> Duration {
    Duration::from_secs(10)
}

/// Rank `r`'s input of `len` elements: small multiples of 1/4, so every
/// sum is exact whatever the order and can be compared with `==`.
fn exact_input(r: usize, len: usize, f64: bool) -> Buffer {
    let v = (0..len).map(|i| ((r * 7 + i * 3) % 11) as f64 * 0.25 - 1.0);
    if f64 {
        Buffer::F64(v.collect())
    } else {
        Buffer::F32(v.map(|x| x as f32).collect())
    }
}

/// Rank `r`'s input with rounding in every sum, to see that the ranks
/// agree on the bits.
fn rounding_input(r: usize, len: usize) -> Buffer {
    Buffer::F32(
        (0..len)
            .map(|i| 0.1 * (r + 1) as f32 + (i as f32).sin() / 3.0)
            .collect(),
    )
}

fn direct_sum(group: &[usize], len: usize, f64: bool) -> Buffer {
    let mut sum = exact_input(group[0], len, f64);
    for &r in &group[1..] {
        sum.add_assign(&exact_input(r, len, f64)).unwrap();
    }
    sum
}

/// The model's bytes per group position, as integers.
fn model(c: Collective, a: Algorithm, n: usize, bytes: u64) -> Vec<u64> {
    bytes_sent(c, a, n, bytes as f64)
        .unwrap()
        .into_iter()
        .map(|b| b as u64)
        .collect()
}

fn split(results: Vec<(Buffer, u64)>) -> (Vec<Buffer>, Vec<u64>) {
    results.into_iter().unzip()
}

#[test]
fn all_reduce_sums_and_sends_the_model_bytes() {
    for algorithm in [Algorithm::Ring, Algorithm::ParameterServer] {
        for group in GROUPS {
            for f64 in [false, true] {
                let len = 12; // divisible by 1, 2, 3, 4
                let (got, bytes) = split(run(group, long(), |ep, _| {
                    let mut data = exact_input(ep.rank(), len, f64);
                    ep.all_reduce(group, &mut data, algorithm, "t0", "all-reduce test")
                        .unwrap();
                    data
                }));
                let want = direct_sum(group, len, f64);
                assert!(got.iter().all(|g| *g == want), "{algorithm:?} {group:?}");
                let full = want.byte_len();
                assert_eq!(bytes, model(Collective::AllReduce, algorithm, group.len(), full));
            }
        }
    }
}

#[test]
fn ring_all_reduce_handles_lengths_that_do_not_divide() {
    for (group, len) in [(&[0, 1, 2, 3][..], 5), (&[0, 2, 3][..], 2), (&[1, 3][..], 0)] {
        let (got, _) = split(run(group, long(), |ep, _| {
            let mut data = exact_input(ep.rank(), len, false);
            ep.all_reduce(group, &mut data, Algorithm::Ring, "t", "odd all-reduce")
                .unwrap();
            data
        }));
        let want = direct_sum(group, len, false);
        assert!(got.iter().all(|g| *g == want), "{group:?} len {len}");
    }
}

#[test]
fn results_are_bitwise_equal_across_ranks_and_runs() {
    let group = [0, 1, 2, 3];
    let reduce = |algorithm| {
        run(&group, long(), |ep, _| {
            let mut data = rounding_input(ep.rank(), 37);
            ep.all_reduce(&group, &mut data, algorithm, "t", "bits").unwrap();
            match data {
                Buffer::F32(v) => v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                Buffer::F64(_) => unreachable!("f32 input"),
            }
        })
    };
    for algorithm in [Algorithm::Ring, Algorithm::ParameterServer] {
        let first: Vec<_> = reduce(algorithm).into_iter().map(|(b, _)| b).collect();
        assert!(first.iter().all(|b| *b == first[0]), "{algorithm:?} ranks differ");
        let again: Vec<_> = reduce(algorithm).into_iter().map(|(b, _)| b).collect();
        assert_eq!(first, again, "{algorithm:?} differs between runs");
        // Close to the plain sum, whatever the order.
        let direct = (0..4).fold(vec![0.0f64; 37], |mut acc, r| {
            if let Buffer::F32(v) = rounding_input(r, 37) {
                acc.iter_mut().zip(v).for_each(|(a, x)| *a += x as f64);
            }
            acc
        });
        for (bits, want) in first[0].iter().zip(direct) {
            assert!((f32::from_bits(*bits) as f64 - want).abs() < 1e-5);
        }
        assert_eq!(first[0], documented_order(algorithm, &group, 37), "{algorithm:?}");
    }
}

/// The bits the documented summation order gives for [`rounding_input`]:
/// the ring sums chunk `c` (balanced lengths) starting at position `c+1`
/// and going round; the parameter server sums in group order.
fn documented_order(algorithm: Algorithm, group: &[usize], len: usize) -> Vec<u32> {
    let inputs: Vec<Vec<f32>> = group
        .iter()
        .map(|&r| match rounding_input(r, len) {
            Buffer::F32(v) => v,
            Buffer::F64(_) => unreachable!("f32 input"),
        })
        .collect();
    let n = group.len();
    let lengths = Buffer::balanced_lengths(len, n);
    let chunk_of = |i: usize| {
        let mut end = 0;
        lengths.iter().position(|&l| {
            end += l;
            i < end
        })
    };
    (0..len)
        .map(|i| {
            let first = match algorithm {
                Algorithm::Ring => chunk_of(i).expect("inside the buffer") + 1,
                _ => 0,
            };
            let order = (0..n).map(|k| (first + k) % n);
            order
                .map(|pos| inputs[pos][i])
                .reduce(|sum, x| sum + x)
                .unwrap()
                .to_bits()
        })
        .collect()
}

#[test]
fn reduce_scatter_gives_position_p_chunk_p_of_the_sum() {
    for group in GROUPS {
        for f64 in [false, true] {
            let len = 12;
            let (got, bytes) = split(run(group, long(), |ep, _| {
                let data = exact_input(ep.rank(), len, f64);
                ep.reduce_scatter(group, &data, "t", "reduce-scatter test")
                    .unwrap()
            }));
            let want = direct_sum(group, len, f64).split_even(group.len()).unwrap();
            assert_eq!(got, want, "{group:?}");
            let full = exact_input(0, len, f64).byte_len();
            assert_eq!(
                bytes,
                model(Collective::ReduceScatter, Algorithm::Ring, group.len(), full)
            );
        }
    }
}

#[test]
fn all_gather_concatenates_in_group_order() {
    for group in GROUPS {
        for f64 in [false, true] {
            let (got, bytes) = split(run(group, long(), |ep, _| {
                ep.all_gather(group, &exact_input(ep.rank(), 3, f64), "t", "all-gather test")
                    .unwrap()
            }));
            let parts: Vec<_> = group.iter().map(|&r| exact_input(r, 3, f64)).collect();
            let want = Buffer::concat(&parts).unwrap();
            assert!(got.iter().all(|g| *g == want), "{group:?}");
            assert_eq!(
                bytes,
                model(
                    Collective::AllGather,
                    Algorithm::Ring,
                    group.len(),
                    want.byte_len()
                )
            );
        }
    }
}

#[test]
fn all_to_all_transposes_chunks() {
    for group in GROUPS {
        for f64 in [false, true] {
            let n = group.len();
            let len = 2 * n;
            let (got, bytes) = split(run(group, long(), |ep, _| {
                ep.all_to_all(group, &exact_input(ep.rank(), len, f64), "t", "all-to-all test")
                    .unwrap()
            }));
            for (i, result) in got.iter().enumerate() {
                // Chunk j of position i's result is chunk i of position j's input.
                let want: Vec<_> = group
                    .iter()
                    .map(|&r| exact_input(r, len, f64).split_even(n).unwrap().swap_remove(i))
                    .collect();
                assert_eq!(*result, Buffer::concat(&want).unwrap(), "{group:?} position {i}");
            }
            let full = exact_input(0, len, f64).byte_len();
            assert_eq!(bytes, model(Collective::AllToAll, Algorithm::Ring, n, full));
        }
    }
}

#[test]
fn broadcast_copies_the_root_along_a_chain() {
    for group in GROUPS {
        for root in 0..group.len() {
            let (got, bytes) = split(run(group, long(), |ep, _| {
                let mut data = exact_input(ep.rank(), 6, true);
                ep.broadcast(group, root, &mut data, "t", "broadcast test")
                    .unwrap();
                data
            }));
            let want = exact_input(group[root], 6, true);
            assert!(got.iter().all(|g| *g == want), "{group:?} root {root}");
            // The model's chain starts at position 0; rotate it to the root.
            let mut chain = model(
                Collective::Broadcast,
                Algorithm::Ring,
                group.len(),
                want.byte_len(),
            );
            chain.rotate_right(root);
            assert_eq!(bytes, chain, "{group:?} root {root}");
        }
    }
}

#[test]
fn point_to_point_matches_by_tag_and_counts_bytes() {
    let got = run(&[0, 1], long(), |ep, pos| {
        if pos == 0 {
            ep.send(1, "a", Buffer::F32(vec![1.0; 3]), "send a").unwrap();
            ep.send(1, "b", Buffer::F64(vec![2.0; 5]), "send b").unwrap();
            None
        } else {
            // Taken out of arrival order: tags, not order, decide.
            let b = ep.recv(0, "b", "recv b").unwrap();
            let a = ep.recv(0, "a", "recv a").unwrap();
            Some((a, b))
        }
    });
    let expected = (Buffer::F32(vec![1.0; 3]), Buffer::F64(vec![2.0; 5]));
    assert_eq!(got[1].0, Some(expected));
    let model_bytes: f64 = [12.0, 40.0]
        .iter()
        .map(|&b| bytes_sent(Collective::SendRecv, Algorithm::Ring, 2, b).unwrap()[0])
        .sum();
    assert_eq!(got[0].1 as f64, model_bytes);
    assert_eq!(got[1].1, 0);
}

#[test]
fn a_rank_that_never_arrives_times_out_the_others() {
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    // Rank 2 is in the group but never calls the collective.
    let group = [0, 1, 2];
    let got = run(&[0, 1], timeout, |ep, _| {
        let mut data = exact_input(ep.rank(), 6, false);
        ep.all_reduce(
            &group,
            &mut data,
            Algorithm::Ring,
            "t",
            "instruction 57 (all-reduce of grads)",
        )
        .unwrap_err()
    });
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    // Rank 0 waits on its ring predecessor, rank 2.
    match &got[0].0 {
        CommError::Timeout {
            rank,
            peer,
            what,
            waited_s,
        } => {
            assert_eq!((*rank, *peer), (0, 2));
            assert_eq!(what, "instruction 57 (all-reduce of grads)");
            assert_eq!(*waited_s, 0.2);
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        got[0].0.to_string(),
        "rank 0: instruction 57 (all-reduce of grads) waited 0.2 s for rank 2; deadlock or a failed rank"
    );
    // Rank 1 then starves waiting on rank 0.
    assert!(
        matches!(got[1].0, CommError::Timeout { rank: 1, peer: 0, .. }),
        "{}",
        got[1].0
    );
}

#[test]
fn abort_wakes_a_blocked_rank_at_once() {
    for kind in [Kind::InProcess, Kind::Tcp] {
        abort_wakes_a_blocked_rank_at_once_on(kind);
    }
}

fn abort_wakes_a_blocked_rank_at_once_on(kind: Kind) {
    let got = run_on(kind, &[0, 1], long(), |ep, pos| {
        if pos == 0 {
            std::thread::sleep(Duration::from_millis(50));
            ep.abort("kernel failed on node 3");
            (Instant::now(), None)
        } else {
            let err = ep.recv(0, "never", "instruction 9 (recv)").unwrap_err();
            let woke = Instant::now();
            (
                woke,
                Some((err, ep.send(0, "x", Buffer::F32(vec![]), "late send"))),
            )
        }
    });
    let (aborted_at, woke_at) = (got[0].0 .0, got[1].0 .0);
    assert!(
        woke_at.saturating_duration_since(aborted_at) < Duration::from_millis(200),
        "{kind:?}"
    );
    let (err, late) = got[1].0 .1.clone().unwrap();
    assert_eq!(
        err,
        CommError::Aborted {
            rank: 1,
            by: 0,
            reason: "kernel failed on node 3".into(),
            what: "instruction 9 (recv)".into()
        }
    );
    assert!(matches!(late, Err(CommError::Aborted { by: 0, .. })));
}

#[test]
fn uneven_and_mismatched_buffers_are_errors() {
    let group = [0, 1, 2];
    let got = run(&group, long(), |ep, _| {
        let data = exact_input(ep.rank(), 4, false);
        (
            ep.reduce_scatter(&group, &data, "rs", "rs").unwrap_err(),
            ep.all_to_all(&group, &data, "a2a", "a2a").unwrap_err(),
        )
    });
    for ((rs, a2a), _) in &got {
        assert!(matches!(rs, CommError::Uneven { len: 4, parts: 3, .. }), "{rs}");
        assert!(matches!(a2a, CommError::Uneven { len: 4, parts: 3, .. }), "{a2a}");
    }
    // Rank 1 holds f64 where rank 0 holds f32: both see the other's chunk.
    let got = run(&[0, 1], long(), |ep, pos| {
        let mut data = exact_input(ep.rank(), 4, pos == 1);
        ep.all_reduce(&[0, 1], &mut data, Algorithm::Ring, "t", "mixed")
            .unwrap_err()
    });
    assert_eq!(
        got[0].0.to_string(),
        "rank 0: mixed: buffer from rank 1 does not match: expected f32[2], got f64[2]"
    );
    assert!(matches!(got[1].0, CommError::Mismatch { rank: 1, peer: 0, .. }));
    // All-gather chunks of different lengths.
    let got = run(&[0, 1], long(), |ep, pos| {
        ep.all_gather(&[0, 1], &exact_input(0, 2 + pos, false), "t", "ag")
            .unwrap_err()
    });
    assert!(got.iter().all(|(e, _)| matches!(e, CommError::Mismatch { .. })));
}

#[test]
fn bad_groups_roots_and_algorithms_are_refused_before_any_message() {
    let ep = fabric(3, long()).swap_remove(1);
    let mut data = Buffer::F32(vec![1.0; 4]);
    let errs = [
        ep.all_reduce(&[0, 2], &mut data, Algorithm::Ring, "t", "w")
            .unwrap_err(),
        ep.all_reduce(&[], &mut data, Algorithm::Ring, "t", "w")
            .unwrap_err(),
        ep.all_reduce(&[1, 1], &mut data, Algorithm::Ring, "t", "w")
            .unwrap_err(),
        ep.all_reduce(&[1, 5], &mut data, Algorithm::Ring, "t", "w")
            .unwrap_err(),
        ep.all_reduce(&[1], &mut data, Algorithm::Tree, "t", "w")
            .unwrap_err(),
        ep.broadcast(&[0, 1], 2, &mut data, "t", "w").unwrap_err(),
        ep.send(3, "t", data.clone(), "w").unwrap_err(),
        ep.recv(7, "t", "w").unwrap_err(),
    ];
    let messages: Vec<_> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "rank 1: w: this rank is not in group [0, 2]",
            "rank 1: w: bad group []: it is empty",
            "rank 1: w: bad group [1, 1]: rank 1 appears twice",
            "rank 1: w: bad group [1, 5]: rank 5 is outside a world of 3",
            "rank 1: w: Tree AllReduce is not implemented",
            "rank 1: w: root position 2 is outside a group of 2",
            "rank 1: w: no rank 3 in a world of 3",
            "rank 1: w: no rank 7 in a world of 3",
        ]
    );
    assert_eq!(ep.bytes_sent(), 0);
}

#[test]
fn a_rank_whose_process_exits_aborts_its_peers() {
    let mut endpoints = tcp_fabric(2, long());
    let started = Instant::now();
    // Rank 1's process goes away without closing: its sockets shut.
    drop(endpoints.pop());
    let err = endpoints[0].recv(1, "t", "instruction 4 (recv)").unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    match &err {
        CommError::Aborted {
            rank: 0,
            by: 1,
            reason,
            what,
        } => {
            assert!(reason.contains("did its process exit?"), "{reason}");
            assert_eq!(what, "instruction 4 (recv)");
        }
        other => panic!("{other}"),
    }
}

/// 16-bit reductions: exact inputs (quarters, sums below 2^8) are bf16 and
/// f16 values, so the sums are exact; every member gets the same bits; a
/// rank sends half the bytes of the f32 reduction; and values that do not
/// fit in 16 bits end rounded, the same on every member.
#[test]
fn narrow_reductions_sum_in_16_bits_and_send_half_the_bytes() {
    for wire in [Half::Bf16, Half::F16] {
        for group in GROUPS {
            for f64 in [false, true] {
                let len = 24;
                let (got, bytes) = split(run(group, long(), |ep, _| {
                    let mut data = exact_input(ep.rank(), len, f64);
                    ep.all_reduce_narrow(group, &mut data, wire, "n0", "narrow all-reduce")
                        .unwrap();
                    data
                }));
                let want = direct_sum(group, len, f64);
                assert!(got.iter().all(|g| *g == want), "{wire:?} {group:?}");
                let f32_bytes = (len * 4) as u64;
                let half = |b: Vec<u64>| b.into_iter().map(|x| x / 2).collect::<Vec<_>>();
                let model_bytes = model(Collective::AllReduce, Algorithm::Ring, group.len(), f32_bytes);
                assert_eq!(bytes, half(model_bytes), "{wire:?} {group:?}");
                let (shares, bytes) = split(run(group, long(), |ep, _| {
                    let data = exact_input(ep.rank(), len, f64);
                    ep.reduce_scatter_narrow(group, &data, wire, "n1", "narrow reduce-scatter")
                        .unwrap()
                }));
                let chunk = len / group.len();
                for (pos, share) in shares.iter().enumerate() {
                    let mut whole = want.clone();
                    with_elements!(&mut whole, w => {
                        let mine: Vec<_> = w[pos * chunk..(pos + 1) * chunk].to_vec();
                        w.clear();
                        w.extend(mine);
                    });
                    assert_eq!(*share, whole, "{wire:?} {group:?} position {pos}");
                }
                let model_bytes = model(Collective::ReduceScatter, Algorithm::Ring, group.len(), f32_bytes);
                assert_eq!(bytes, half(model_bytes), "{wire:?} {group:?}");
            }
        }
    }
    // Sums that round: every member agrees, within bf16's precision of the f64 sum.
    let group = &[0, 1, 2, 3][..];
    let (got, _) = split(run(group, long(), |ep, _| {
        let mut data = rounding_input(ep.rank(), 10);
        ep.all_reduce_narrow(group, &mut data, Half::Bf16, "n2", "rounded")
            .unwrap();
        data
    }));
    assert!(got.windows(2).all(|w| w[0] == w[1]));
    let Buffer::F32(sum) = &got[0] else { panic!("f32") };
    for (i, &s) in sum.iter().enumerate() {
        let exact: f64 = (0..4)
            .map(|r| 0.1 * (r + 1) as f64 + (i as f64).sin() / 3.0)
            .sum();
        assert!(
            (s as f64 - exact).abs() <= 0.02 * exact.abs().max(1.0),
            "{i}: {s} vs {exact}"
        );
    }
}

#[test]
fn all_to_all_v_moves_pieces_of_any_length() {
    for group in GROUPS {
        let n = group.len();
        // Position p sends p + q + 1 elements to position q, valued 100·p + q.
        let (got, bytes) = split(run(group, long(), |ep, _| {
            let p = group.iter().position(|&r| r == ep.rank()).unwrap();
            let send: Vec<usize> = (0..n).map(|q| p + q + 1).collect();
            let recv: Vec<usize> = (0..n).map(|q| q + p + 1).collect();
            let data: Vec<f64> = (0..n)
                .flat_map(|q| vec![(100 * p + q) as f64; p + q + 1])
                .collect();
            ep.all_to_all_v(group, &Buffer::F64(data), &send, &recv, "t", "all-to-all-v test")
                .unwrap()
        }));
        for (p, result) in got.iter().enumerate() {
            let want: Vec<f64> = (0..n)
                .flat_map(|q| vec![(100 * q + p) as f64; q + p + 1])
                .collect();
            assert_eq!(*result, Buffer::F64(want), "{group:?} position {p}");
        }
        // Only what leaves a rank counts.
        for (p, &sent) in bytes.iter().enumerate() {
            let off_rank: usize = (0..n).filter(|&q| q != p).map(|q| p + q + 1).sum();
            assert_eq!(sent, (off_rank * 8) as u64, "{group:?} position {p}");
        }
    }
}

/// Top-k with error feedback: every member gets the same sum of what each
/// sent (its `k` largest values), sends `k` values and indices to each
/// other member, and keeps the rest for the next call, so two calls on
/// the same inputs deliver everything the ranks held.
#[test]
fn top_k_sends_the_largest_values_and_keeps_the_rest_for_next_time() {
    for group in GROUPS {
        let n = group.len();
        let len = 12;
        let kept = 6;
        let (got, bytes) = split(run(group, long(), |ep, _| {
            let mut state = Feedback::default();
            let input = exact_input(ep.rank(), len, false);
            let mut first = input.clone();
            ep.all_reduce_topk(group, &mut first, kept, &mut state, "k0", "top-k")
                .unwrap();
            // A zero gradient next: only what was kept back arrives.
            let mut second = Buffer::F32(vec![0.0; len]);
            ep.all_reduce_topk(group, &mut second, kept, &mut state, "k1", "top-k")
                .unwrap();
            let both: Vec<f32> = match (&first, &second) {
                (Buffer::F32(a), Buffer::F32(b)) => a.iter().zip(b).map(|(x, y)| x + y).collect(),
                _ => unreachable!(),
            };
            Buffer::F32(both)
        }));
        let want = direct_sum(group, len, false);
        for g in &got {
            assert_eq!(*g, want, "{group:?}");
        }
        if n > 1 {
            // Two all-gathers of k values and k indices.
            let each = model(
                Collective::AllGather,
                Algorithm::Ring,
                n,
                (n * 2 * kept * 4) as u64,
            );
            let twice: Vec<u64> = each.iter().map(|b| 2 * b).collect();
            assert_eq!(bytes, twice, "{group:?}");
        }
    }
}

/// PowerSGD: a rank-1 matrix is found exactly by a rank-1 factorisation, so
/// the sum of rank-1 inputs sharing a row space arrives whole (up to
/// rounding), vectors go whole, and the bytes are the factors' and the
/// vector's, in two all-reduces.
#[test]
fn power_sgd_sums_low_rank_gradients_in_factors() {
    for group in GROUPS {
        let n = group.len();
        let (rows, cols) = (6, 5);
        let (got, bytes) = split(run(group, long(), |ep, _| {
            let scale = ep.rank() as f64 + 1.0;
            // Matrix u·vᵀ scaled by the rank, then a vector of 3.
            let mut values: Vec<f64> = (0..rows)
                .flat_map(|i| (0..cols).map(move |j| scale * (i as f64 + 1.0) * (j as f64 - 2.0)))
                .collect();
            values.extend([scale, 2.0 * scale, 3.0 * scale]);
            let mut data = Buffer::F64(values);
            let mut state = Feedback::default();
            ep.all_reduce_powersgd(
                group,
                &mut data,
                &[(rows, cols), (3, 1)],
                1,
                &mut state,
                "p",
                "powersgd",
            )
            .unwrap();
            data
        }));
        let total: f64 = group.iter().map(|&r| r as f64 + 1.0).sum();
        for g in &got {
            let Buffer::F64(v) = g else { unreachable!() };
            for i in 0..rows {
                for j in 0..cols {
                    let want = total * (i as f64 + 1.0) * (j as f64 - 2.0);
                    assert!(
                        (v[i * cols + j] - want).abs() < 1e-9,
                        "{group:?} ({i}, {j}): {}",
                        v[i * cols + j]
                    );
                }
            }
            assert_eq!(&v[rows * cols..], &[total, 2.0 * total, 3.0 * total]);
            assert_eq!(g, &got[0], "every member gets the same bits");
        }
        if n > 1 {
            let ar =
                |elements: usize| model(Collective::AllReduce, Algorithm::Ring, n, (elements * 8) as u64);
            // Over the group (chunks of odd lengths differ by an element;
            // the model rounds each member's share down).
            let want: u64 = ar(rows + 3).iter().chain(&ar(cols)).sum();
            let sent: u64 = bytes.iter().sum();
            assert!(
                sent >= want && sent <= want + 2 * n as u64,
                "{group:?}: {sent} vs {want}"
            );
        }
    }
}
