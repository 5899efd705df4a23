//! Whether per-rank programs finish when each collective holds its rank
//! until every member reaches the same one — as a GPU stream runs NCCL
//! calls, in program order. The fabric's collectives match by tag, so
//! programs whose members meet their collectives in different orders can
//! still finish on the CPU, and would hang on NCCL; this check replays the
//! programs' communication without data and finds that before anything
//! runs.
//!
//! Transfers (pipeline sends and receives) are checked either as the fabric
//! runs them — a send is buffered and never waits — or as NCCL would: a run
//! of consecutive transfers (frees between them allowed) is one group, posted
//! at once, which completes when every transfer's counterpart has been
//! posted by its peer.

use super::{Instr, Program};
use std::collections::{BTreeMap, HashMap};

/// How transfers run, for [`check_blocking`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfers {
    /// A send is buffered and returns at once; a receive waits for its send.
    Buffered,
    /// Runs of transfers are groups that wait for their counterparts.
    Grouped,
}

/// One step of a rank's communication.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Meet {
    /// Every member of `group` must be at this collective (same `what`).
    Collective { group: Vec<usize>, what: String },
    /// Transfers posted together.
    Transfers(Vec<Transfer>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Transfer {
    send: bool,
    peer: usize,
    what: String,
}

/// Where the replay stopped: each unfinished rank and what it waits at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ranks wait on each other: {}", waiting.iter().map(|(r, w)| format!("rank {r} at {w}")).collect::<Vec<_>>().join(", "))]
pub struct Deadlock {
    pub waiting: Vec<(usize, String)>,
}

/// Whether `instr` continues a run of transfers that [`Transfers::Grouped`]
/// posts as one group (a transfer, or a free between transfers). Runtimes
/// that group transfers close a group at the first instruction for which
/// this is false.
pub fn continues_transfers(instr: &Instr) -> bool {
    instr.is_transfer() || matches!(instr, Instr::Free { .. })
}

/// Replays `programs`' communication under blocking collectives and
/// `transfers`; `Err` names the ranks that would wait forever.
pub fn check_blocking(programs: &[Program], transfers: Transfers) -> Result<(), Deadlock> {
    let meets: Vec<Vec<Meet>> = programs.iter().map(|p| communication(p, transfers)).collect();
    replay(&meets, transfers)
}

/// [`check_blocking`] over each rank's communication.
fn replay<'p>(meets: &'p [Vec<Meet>], transfers: Transfers) -> Result<(), Deadlock> {
    let mut at = vec![0usize; meets.len()];
    // Transfers posted per (from, to, what): (sends, receives), and the
    // ordinals of each rank's posted transfers (matched in order).
    let mut posted: HashMap<(usize, usize, &str), (usize, usize)> = HashMap::new();
    let mut ordinals: Vec<Option<Vec<usize>>> = vec![None; meets.len()];
    loop {
        let mut moved = false;
        for rank in 0..meets.len() {
            while let Some(m) = meets[rank].get(at[rank]) {
                match m {
                    Meet::Collective { group, what } => {
                        let all_here = group.iter().all(|&r| {
                            matches!(meets.get(r).and_then(|ms| ms.get(at[r])),
                                Some(Meet::Collective { group: g, what: w }) if g == group && w == what)
                        });
                        if !all_here {
                            break;
                        }
                        for &r in group.iter().filter(|&&r| r != rank) {
                            at[r] += 1;
                        }
                    }
                    Meet::Transfers(ts) => {
                        let key = |t: &'p Transfer| match t.send {
                            true => (rank, t.peer, t.what.as_str()),
                            false => (t.peer, rank, t.what.as_str()),
                        };
                        let mine = ordinals[rank].get_or_insert_with(|| {
                            ts.iter()
                                .map(|t| {
                                    let n = posted.entry(key(t)).or_insert((0, 0));
                                    let side = if t.send { &mut n.0 } else { &mut n.1 };
                                    *side += 1;
                                    *side
                                })
                                .collect()
                        });
                        let done = ts.iter().zip(mine.iter()).all(|(t, &k)| {
                            let (sends, recvs) = posted[&key(t)];
                            match (t.send, transfers) {
                                (true, Transfers::Buffered) => true,
                                (true, Transfers::Grouped) => recvs >= k,
                                (false, _) => sends >= k,
                            }
                        });
                        if !done {
                            break;
                        }
                        ordinals[rank] = None;
                    }
                }
                at[rank] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let waiting: Vec<(usize, String)> = meets
        .iter()
        .enumerate()
        .filter_map(|(r, ms)| ms.get(at[r]).map(|m| (r, describe(m))))
        .collect();
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(Deadlock { waiting })
    }
}

/// Whether every ordered pair of ranks meets its transfers in one order:
/// the k-th transfer a rank sends a peer is the k-th the peer receives
/// from it. NCCL matches a pair's sends and receives by order (the fabric
/// by tag), so runtimes route transfers to NCCL only when this holds;
/// `Err` names the first pair and place where the orders differ.
pub fn check_transfer_order(programs: &[Program]) -> Result<(), String> {
    type Sequences = BTreeMap<(usize, usize), Vec<String>>;
    let (mut sent, mut received): (Sequences, Sequences) = Default::default();
    for p in programs {
        for t in p.instructions.iter().filter_map(transfer) {
            match t.send {
                true => sent.entry((p.rank, t.peer)).or_default().push(t.what),
                false => received.entry((t.peer, p.rank)).or_default().push(t.what),
            }
        }
    }
    let pairs: std::collections::BTreeSet<&(usize, usize)> = sent.keys().chain(received.keys()).collect();
    for &(from, to) in pairs {
        let none = Vec::new();
        let (s, r) = (
            sent.get(&(from, to)).unwrap_or(&none),
            received.get(&(from, to)).unwrap_or(&none),
        );
        let k = s.iter().zip(r).take_while(|(a, b)| a == b).count();
        if k < s.len().max(r.len()) {
            let name = |v: &[String]| v.get(k).map_or("nothing".to_string(), Clone::clone);
            return Err(format!(
                "rank {from}'s transfer {} to rank {to} sends {}, where rank {to} receives {}",
                k + 1,
                name(s),
                name(r)
            ));
        }
    }
    Ok(())
}

/// `program`'s communication in order.
fn communication(program: &Program, transfers: Transfers) -> Vec<Meet> {
    let rank = program.rank;
    let mut out: Vec<Meet> = Vec::new();
    let mut open = false;
    for instr in &program.instructions {
        if let Some(t) = transfer(instr) {
            match out.last_mut() {
                Some(Meet::Transfers(ts)) if open && transfers == Transfers::Grouped => ts.push(t),
                _ => out.push(Meet::Transfers(vec![t])),
            }
            open = true;
            continue;
        }
        open &= continues_transfers(instr);
        let Some(group) = instr.group() else {
            continue;
        };
        if group.len() > 1 && group.contains(&rank) {
            out.push(Meet::Collective {
                group: group.to_vec(),
                what: instr.describe(),
            });
        }
    }
    out
}

/// `instr` as a transfer, if it is one.
fn transfer(instr: &Instr) -> Option<Transfer> {
    instr.transfer().map(|t| Transfer {
        send: t.send,
        peer: t.peer,
        what: t.payload.to_string(),
    })
}

fn describe(m: &Meet) -> String {
    match m {
        Meet::Collective { group, what } => format!("{what} over ranks {group:?}"),
        Meet::Transfers(ts) => ts
            .iter()
            .map(|t| match t.send {
                true => format!("send {} to rank {}", t.what, t.peer),
                false => format!("recv {} from rank {}", t.what, t.peer),
            })
            .collect::<Vec<_>>()
            .join(" + "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Coord, Strategy};
    use autopar_cost_models::comm::Algorithm;
    use autopar_cost_models::Schedule;

    fn programs(s: &Strategy) -> Vec<Program> {
        crate::tiny_gpt_programs(4, s)
    }

    /// The lowering's plans, across data, tensor and pipeline parallelism,
    /// ZeRO stages and schedules, meet their collectives in one order.
    #[test]
    fn lowered_plans_finish_under_blocking_collectives() {
        for (dp, pp, tp, zero, schedule) in [
            (2, 1, 1, 0, Schedule::OneFOneB),
            (2, 1, 1, 3, Schedule::OneFOneB),
            (1, 1, 2, 0, Schedule::OneFOneB),
            (1, 2, 1, 0, Schedule::Gpipe),
            (2, 2, 2, 1, Schedule::OneFOneB),
            (2, 2, 2, 2, Schedule::Interleaved),
        ] {
            let mut s = Strategy::new(dp, pp, 4, 1, 4).with_tp(tp, false);
            s.zero = zero;
            s.schedule = schedule;
            if schedule == Schedule::Interleaved {
                s.chunks = 2;
            }
            let p = programs(&s);
            let case = format!("dp {dp} pp {pp} tp {tp} zero {zero} {schedule:?}");
            assert_eq!(check_blocking(&p, Transfers::Buffered), Ok(()), "{case}");
            // Grouped transfers serve 1F1B and GPipe; the interleaved
            // schedule's stages send ahead of what their peers receive.
            let grouped = check_blocking(&p, Transfers::Grouped);
            assert_eq!(
                grouped.is_ok(),
                schedule != Schedule::Interleaved,
                "{case}: {grouped:?}"
            );
        }
    }

    /// One transfer at a time, 1F1B's steady state would hang: each stage
    /// sends before it receives what its neighbour sends it.
    #[test]
    fn a_send_that_waits_needs_its_receive_in_the_same_group() {
        let buf = |t: &str| crate::Buf::of(t, 0);
        let send = |t: &str, to| Instr::Send { buf: buf(t), to };
        let recv = |t: &str, from| Instr::Recv { buf: buf(t), from };
        let free = Instr::Free { buf: buf("x") };
        let ps = [
            program(0, vec![send("a", 1), free.clone(), recv("b", 1)]),
            program(1, vec![send("b", 0), recv("a", 0)]),
        ];
        assert_eq!(check_blocking(&ps, Transfers::Buffered), Ok(()));
        assert_eq!(check_blocking(&ps, Transfers::Grouped), Ok(()));
        // Work between the send and the receive splits the group.
        let ps = [
            program(0, vec![send("a", 1), all_reduce("g", &[0]), recv("b", 1)]),
            program(1, vec![send("b", 0), recv("a", 0)]),
        ];
        assert_eq!(check_blocking(&ps, Transfers::Buffered), Ok(()));
        let err = check_blocking(&ps, Transfers::Grouped).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ranks wait on each other: rank 0 at send a@mb0 to rank 1, rank 1 at send b@mb0 to rank 0 + recv a@mb0 from rank 0"
        );
    }

    /// The lowering's pipelines send and receive each pair's transfers in
    /// one order; a swapped pair of receives is named.
    #[test]
    fn transfers_pair_up_in_order() {
        for schedule in [Schedule::OneFOneB, Schedule::Gpipe, Schedule::Interleaved] {
            let mut s = Strategy::new(2, 2, 4, 1, 4).with_tp(2, false);
            s.schedule = schedule;
            if schedule == Schedule::Interleaved {
                s.chunks = 2;
            }
            assert_eq!(check_transfer_order(&programs(&s)), Ok(()), "{schedule:?}");
        }
        let buf = |t: &str| crate::Buf::of(t, 0);
        let send = |t: &str, to| Instr::Send { buf: buf(t), to };
        let recv = |t: &str, from| Instr::Recv { buf: buf(t), from };
        let ps = [
            program(0, vec![send("a", 1), send("b", 1)]),
            program(1, vec![recv("b", 0), recv("a", 0)]),
        ];
        assert_eq!(check_blocking(&ps, Transfers::Buffered), Ok(()));
        assert_eq!(
            check_transfer_order(&ps),
            Err("rank 0's transfer 1 to rank 1 sends a@mb0, where rank 1 receives b@mb0".into())
        );
        let ps = [program(0, vec![send("a", 1)]), program(1, vec![])];
        assert_eq!(
            check_transfer_order(&ps),
            Err("rank 0's transfer 1 to rank 1 sends a@mb0, where rank 1 receives nothing".into())
        );
    }

    fn program(rank: usize, instructions: Vec<Instr>) -> Program {
        Program {
            rank,
            coord: Coord {
                tp: 0,
                cp: 0,
                dp: rank,
                pp: 0,
            },
            params: Vec::new(),
            instructions,
        }
    }

    fn all_reduce(param: &str, group: &[usize]) -> Instr {
        Instr::AllReduceGrad {
            params: vec![param.into()],
            group: group.to_vec(),
            reduction: Algorithm::Ring,
            compression: None,
        }
    }

    #[test]
    fn collectives_met_in_different_orders_are_a_deadlock() {
        let ps = [
            program(0, vec![all_reduce("a", &[0, 1]), all_reduce("b", &[0, 1])]),
            program(1, vec![all_reduce("b", &[0, 1]), all_reduce("a", &[0, 1])]),
        ];
        let err = check_blocking(&ps, Transfers::Buffered).unwrap_err();
        assert_eq!(err.waiting.len(), 2);
        assert!(
            err.to_string().starts_with(
                "ranks wait on each other: rank 0 at all-reduce (Ring) grad of 'a' over ranks [0, 1]"
            ),
            "{err}"
        );
        // Three ranks in a cycle of pairwise groups.
        let ps = [
            program(0, vec![all_reduce("x", &[0, 1]), all_reduce("z", &[0, 2])]),
            program(1, vec![all_reduce("y", &[1, 2]), all_reduce("x", &[0, 1])]),
            program(2, vec![all_reduce("z", &[0, 2]), all_reduce("y", &[1, 2])]),
        ];
        assert_eq!(
            check_blocking(&ps, Transfers::Buffered)
                .unwrap_err()
                .waiting
                .len(),
            3
        );
        // A receive with no send waits forever; a buffered send does not.
        let recv = Instr::Recv {
            buf: crate::Buf::of("t", 0),
            from: 1,
        };
        let ps = [program(0, vec![recv]), program(1, vec![all_reduce("a", &[1])])];
        assert_eq!(
            check_blocking(&ps, Transfers::Buffered)
                .unwrap_err()
                .waiting
                .len(),
            1
        );
    }
}
