//! The replay: every representative rank walks its compiled program in
//! order. An instruction starts when its lane is free and its inputs are
//! ready; a receive completes when the matching send's message arrives; a
//! collective starts when every class in its group has reached it. A rank
//! that waits on a peer not yet replayed yields to the others, as a
//! blocking runtime would, so the event times are those of a
//! discrete-event run with one compute stream and a stream per kind of
//! communication per rank. Steps on different streams that cross nodes share
//! the rank's inter-node link ([`shared_link_seconds`]). A rank issues
//! its instructions in program order: a collective starts no earlier than
//! the computation before it in the program has run.

use super::compile::{Activity, Compiled, Lane, MessageKey, Step, Sync, RESIDENT};
use rayon::prelude::*;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// Where a rank's compute lane spent the step.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// Busy and waiting time per activity (waits carry the cause's activity).
    pub seconds: BTreeMap<Activity, f64>,
    /// Compute-lane busy seconds.
    pub busy_s: f64,
    /// Communication lanes' busy seconds (summed over lanes).
    pub comm_busy_s: f64,
    /// Compute-lane stretches, merged: `(start, end, activity)`.
    pub stretches: Vec<(f64, f64, Activity)>,
    /// Peak bytes: weights, gradients, optimizer state and live buffers.
    pub peak_memory_bytes: f64,
    /// `(time, bytes)` whenever the live bytes change.
    pub memory: Vec<(f64, f64)>,
    /// When the rank's last instruction ends.
    pub end_s: f64,
    /// When each timed lane's last instruction ends ([`Lane::index`]).
    pub lane_end_s: [f64; 4],
    /// Timed instructions when labels were compiled: `(lane, label, start, seconds)`.
    pub spans: Vec<(Lane, usize, f64, f64)>,
}

impl Timeline {
    fn stretch(&mut self, start: f64, end: f64, activity: Activity) {
        if end <= start {
            return;
        }
        *self.seconds.entry(activity).or_insert(0.0) += end - start;
        if let Some(last) = self.stretches.last_mut() {
            if last.2 == activity && (start - last.1).abs() <= 1e-12 * end.max(1.0) {
                last.1 = end;
                return;
            }
        }
        self.stretches.push((start, end, activity));
    }
}

/// A rank that can go no further: the instruction it waits at.
#[derive(Debug, thiserror::Error)]
#[error("simulation deadlock: rank {rank} waits at instruction {instruction} and no rank can move")]
pub struct Deadlock {
    pub rank: usize,
    pub instruction: usize,
}

struct RankState {
    pc: usize,
    lane_free: [f64; 4],
    /// When the bytes already handed to the rank's inter-node link would
    /// have crossed it at its full rate.
    link_free: f64,
    ready: Vec<f64>,
    cause: Vec<Activity>,
    last_use: Vec<f64>,
    /// Per group, collectives this rank has finished.
    met: HashMap<u32, u32>,
    /// Live buffer bytes in program order (a buffer is taken when the
    /// instruction writing it is issued and given back at its `Free`, as a
    /// stream-ordered caching allocator sees them), and their peak.
    live: f64,
    peak: f64,
    /// Per slot: live aliases sharing its memory, and whether its own
    /// `Free` came while they still held it (it is given back with the last).
    holders: Vec<u32>,
    freed: Vec<bool>,
    /// `(time, change)` of the live bytes, kept for traces only.
    events: Vec<(f64, f64)>,
    t: Timeline,
}

#[derive(Default)]
struct Meeting {
    arrived: Vec<u32>,
    passed: usize,
    latest: f64,
    /// Every member has arrived; the collective starts at `latest`.
    complete: bool,
}

/// What ranks wait on across each other: messages sent and not yet
/// received, and collectives some members have reached.
#[derive(Default)]
struct Rendezvous {
    messages: HashMap<(u32, u32, MessageKey), f64>,
    meetings: HashMap<(u32, u32), Meeting>,
}

impl Rendezvous {
    /// When a step of rank `me` that could start at `start` on its own
    /// starts after waiting on its peers (`sync`), and whether the wait was
    /// for another stage rather than the communication itself; `None`
    /// while a peer has not come this far.
    fn wait(&mut self, me: usize, st: &mut RankState, step: &Step, start: f64) -> Option<(f64, bool)> {
        match step.sync {
            Sync::Recv { from, key } => {
                let arrival = self.messages.remove(&(from, me as u32, key))?;
                Some((start.max(arrival), false))
            }
            Sync::Meet { group, size } => {
                let size = size as usize;
                let seq = st.met.get(&group).copied().unwrap_or(0);
                let m = self.meetings.entry((group, seq)).or_default();
                if !m.complete {
                    if !m.arrived.contains(&(me as u32)) {
                        m.arrived.push(me as u32);
                        m.latest = m.latest.max(start);
                    }
                    if m.arrived.len() < size {
                        return None;
                    }
                    m.complete = true;
                }
                // Waiting for another stage to arrive is pipeline time, not communication.
                let peer_wait = m.latest - start > step.seconds;
                let start = m.latest;
                m.passed += 1;
                if m.passed == size {
                    self.meetings.remove(&(group, seq));
                }
                st.met.insert(group, seq + 1);
                Some((start, peer_wait))
            }
            Sync::Local | Sync::Send { .. } | Sync::Free { .. } => Some((start, false)),
        }
    }
}

/// Replays `programs`, one per class of ranks.
pub fn replay(programs: &[Compiled]) -> Result<Vec<Timeline>, Deadlock> {
    let mut states: Vec<RankState> = programs
        .iter()
        .map(|p| RankState {
            pc: 0,
            lane_free: [0.0; 4],
            link_free: 0.0,
            ready: vec![0.0; p.slot_bytes.len()],
            cause: vec![Activity::Other; p.slot_bytes.len()],
            last_use: vec![0.0; p.slot_bytes.len()],
            met: HashMap::default(),
            live: 0.0,
            peak: 0.0,
            holders: vec![0; p.slot_bytes.len()],
            freed: vec![false; p.slot_bytes.len()],
            events: Vec::new(),
            t: Timeline::default(),
        })
        .collect();
    let mut rendezvous = Rendezvous::default();
    loop {
        let mut moved = false;
        let mut done = true;
        for (me, p) in programs.iter().enumerate() {
            let st = &mut states[me];
            while st.pc < p.steps.len() && advance(st, p, me, &mut rendezvous) {
                moved = true;
            }
            done &= st.pc >= p.steps.len();
        }
        if done {
            break;
        }
        if !moved {
            let (rank, st) = states
                .iter()
                .enumerate()
                .find(|(i, st)| st.pc < programs[*i].steps.len())
                .map(|(i, st)| (programs[i].rank, st.pc))
                .unwrap_or((0, 0));
            return Err(Deadlock {
                rank,
                instruction: st,
            });
        }
    }
    let step_end = states
        .iter()
        .map(|s| s.lane_free.iter().copied().fold(0.0, f64::max))
        .fold(0.0, f64::max);
    // Each rank's accounting is its own: finish them in parallel.
    Ok(states
        .into_par_iter()
        .zip(programs)
        .map(|(mut st, p)| {
            let compute_end = st.lane_free[0];
            let comm_end = st.lane_free.iter().copied().fold(0.0, f64::max);
            // After its last computation a rank waits for its own
            // communication, then for the slowest rank.
            st.t.stretch(compute_end, comm_end, Activity::DataComm);
            st.t.stretch(comm_end, step_end, Activity::Pipeline);
            st.t.end_s = comm_end;
            st.t.lane_end_s = st.lane_free;
            finish_memory(&mut st, p.static_bytes);
            st.t
        })
        .collect())
}

/// Runs rank `me`'s next step if its inputs, lane and peers allow;
/// false where it waits on a peer.
fn advance(st: &mut RankState, p: &Compiled, me: usize, rendezvous: &mut Rendezvous) -> bool {
    let step = &p.steps[st.pc];
    let reads = p.reads(step);
    let (ready, binding) = reads.iter().fold((0.0f64, None), |(t, b), &s| {
        let r = st.ready[s as usize];
        if r > t {
            (r, Some(s))
        } else {
            (t, b)
        }
    });
    // The rank issues its instructions in program order, each once the
    // computation before it has run (the interpreter computes inline and
    // hands collectives to its streams as it reaches them): a collective
    // never starts before the compute lane has reached it, so nothing is
    // prefetched beyond what the program itself issues early.
    let issued = match step.lane {
        Lane::Collective | Lane::Transfer | Lane::Gradient => st.lane_free[0],
        Lane::Compute | Lane::None => 0.0,
    };
    let start = step
        .lane
        .index()
        .map_or(ready, |l| st.lane_free[l].max(ready).max(issued));
    let Some((start, peer_wait)) = rendezvous.wait(me, st, step, start) else {
        return false;
    };
    let seconds = shared_link_seconds(st, step, start);
    let end = start + seconds;
    account_time(st, p, step, (start, seconds), binding);
    for &s in reads {
        let u = &mut st.last_use[s as usize];
        *u = u.max(end);
    }
    let carried = binding.map(|s| st.cause[s as usize]);
    let keep_curve = !p.labels.is_empty();
    for &s in p.writes(step) {
        st.ready[s as usize] = end;
        st.last_use[s as usize] = end;
        st.cause[s as usize] = match (step.lane, carried) {
            _ if peer_wait => Activity::Pipeline,
            (Lane::None, Some(c)) if !matches!(step.sync, Sync::Recv { .. }) => c,
            _ => step.activity,
        };
        match p.alias_of[s as usize] {
            u32::MAX => {
                st.freed[s as usize] = false;
                let bytes = p.slot_bytes[s as usize];
                if bytes > 0.0 {
                    st.live += bytes;
                    st.peak = st.peak.max(st.live);
                    if keep_curve {
                        st.events.push((start, bytes));
                    }
                }
            }
            RESIDENT => {}
            of => st.holders[of as usize] += 1,
        }
    }
    match step.sync {
        Sync::Send { to, key } => {
            rendezvous.messages.insert((me as u32, to, key), end);
        }
        Sync::Free { slot } => release(st, p, slot, keep_curve),
        Sync::Local | Sync::Recv { .. } | Sync::Meet { .. } => {}
    }
    st.pc += 1;
    true
}

/// Gives back `slot`'s memory at its `Free`: an alias's once it and the
/// slot it shares are both freed, a slot's own once no alias holds it.
fn release(st: &mut RankState, p: &Compiled, slot: u32, keep_curve: bool) {
    let (slot, at) = match p.alias_of[slot as usize] {
        u32::MAX if st.holders[slot as usize] > 0 => {
            st.freed[slot as usize] = true;
            return;
        }
        u32::MAX => (slot as usize, st.last_use[slot as usize]),
        RESIDENT => return,
        of => {
            let of = of as usize;
            st.holders[of] = st.holders[of].saturating_sub(1);
            if st.holders[of] > 0 || !st.freed[of] {
                return;
            }
            st.freed[of] = false;
            (of, st.last_use[of].max(st.last_use[slot as usize]))
        }
    };
    let bytes = p.slot_bytes[slot];
    if bytes > 0.0 {
        st.live -= bytes;
        if keep_curve {
            st.events.push((at, -bytes));
        }
    }
}

/// Seconds of `step` starting at `start` when it shares the rank's
/// inter-node link with what the rank's other streams already sent over
/// it: the two share the link fairly, so a step of `s` seconds on its own
/// behind a backlog of `b` seconds takes `s + min(s, b)` (both at half rate
/// until the shorter is through), and the link's backlog grows by `s` (it
/// moves every byte once). The replay fixes a step's end when it starts,
/// so the earlier step keeps its time: it ends up to `min(s, b)` sooner
/// than fair sharing would end it.
fn shared_link_seconds(st: &mut RankState, step: &Step, start: f64) -> f64 {
    if !step.inter_node {
        return step.seconds;
    }
    let backlog = (st.link_free - start).max(0.0);
    st.link_free = st.link_free.max(start) + step.seconds;
    step.seconds + step.seconds.min(backlog)
}

/// A step's time on its lane: the compute lane's idle stretch before it
/// (charged to what it waited for, `binding`'s cause) and its busy time.
fn account_time(
    st: &mut RankState,
    p: &Compiled,
    step: &Step,
    (start, seconds): (f64, f64),
    binding: Option<u32>,
) {
    let end = start + seconds;
    if step.lane == Lane::Compute && start > st.lane_free[0] {
        let cause = binding.map_or(Activity::Pipeline, |s| st.cause[s as usize]);
        let from = st.lane_free[0];
        st.t.stretch(from, start, cause);
    }
    if let Some(l) = step.lane.index() {
        st.lane_free[l] = end;
    }
    match step.lane {
        Lane::Compute => {
            if step.activity.is_communication() {
                st.t.comm_busy_s += seconds;
            } else {
                st.t.busy_s += seconds;
            }
            st.t.stretch(start, end, step.activity);
        }
        Lane::None => {}
        Lane::Collective | Lane::Transfer | Lane::Gradient => st.t.comm_busy_s += seconds,
    }
    if !p.labels.is_empty() && step.lane != Lane::None {
        st.t.spans.push((step.lane, st.pc, start, seconds));
    }
}

/// The rank's memory peak (weights, gradients and optimizer state plus
/// live buffers) and, when traced, the curve of live bytes over time.
fn finish_memory(st: &mut RankState, static_bytes: f64) {
    st.t.peak_memory_bytes = static_bytes + st.peak;
    let mut events = std::mem::take(&mut st.events);
    // Frees before allocations at the same instant.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut live = 0.0f64;
    let mut curve: Vec<(f64, f64)> = Vec::new();
    for (t, d) in events {
        live += d;
        match curve.last_mut() {
            Some((last_t, bytes)) if *last_t == t => *bytes = static_bytes + live,
            _ => curve.push((t, static_bytes + live)),
        }
    }
    st.t.memory = curve;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(steps: Vec<Step>) -> Vec<Compiled> {
        let mut p = Compiled::default();
        p.steps = steps;
        vec![p]
    }

    /// Two streams' steps across nodes share the rank's link: a pipeline
    /// send of 0.5 s issued beside a 1 s gradient reduction takes 1 s (half
    /// the link while both run); within a node, or one after the other,
    /// each keeps its own time.
    #[test]
    fn concurrent_steps_across_nodes_share_the_link() {
        let across = program(vec![
            Step::local(Lane::Gradient, 1.0, true),
            Step::local(Lane::Transfer, 0.5, true),
        ]);
        let t = &replay(&across).unwrap()[0];
        assert_eq!(t.lane_end_s[2], 1.0);
        assert_eq!(t.lane_end_s[3], 1.0);
        let within = program(vec![
            Step::local(Lane::Gradient, 1.0, false),
            Step::local(Lane::Transfer, 0.5, true),
        ]);
        assert_eq!(replay(&within).unwrap()[0].lane_end_s[2], 0.5);
        // After the link has drained, a later send has it to itself.
        let apart = program(vec![
            Step::local(Lane::Transfer, 0.5, true),
            Step::local(Lane::Compute, 2.0, false),
            Step::local(Lane::Gradient, 1.0, true),
        ]);
        assert_eq!(replay(&apart).unwrap()[0].lane_end_s[3], 3.0);
    }
}
