//! Timelines as Chrome trace-event JSON, the format Perfetto and
//! chrome://tracing open (and the PyTorch profiler writes), for real runs
//! (measured times) and simulations (virtual times): one process per rank,
//! one track for computation and one for communication, and a counter of
//! live bytes.

use autopar_lower::Instr;
use serde_json::{json, Value};

/// Which track of a rank an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stream {
    Compute,
    /// Collectives (in real runs, all the compute thread's communication).
    Communication,
    /// Pipeline transfers (simulations).
    Transfers,
    /// Gradient reduction and parameter gathers (the communication stream
    /// of real runs; simulations).
    Gradients,
}

impl Stream {
    /// The track's id and name.
    fn track(self) -> (usize, &'static str) {
        match self {
            Stream::Compute => (0, "compute"),
            Stream::Communication => (1, "communication"),
            Stream::Transfers => (2, "pipeline transfers"),
            Stream::Gradients => (3, "gradients"),
        }
    }
}

/// One timed instruction, or a memory sample.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceEvent {
    /// An instruction that ran from `start_us` for `duration_us` (since the run began).
    Span {
        rank: usize,
        stream: Stream,
        name: String,
        step: usize,
        start_us: f64,
        duration_us: f64,
    },
    /// Live micro-batch buffers of `rank` at `at_us`.
    Memory { rank: usize, at_us: f64, bytes: u64 },
}

/// The track an instruction is drawn on; `None` for bookkeeping that takes no time.
pub fn stream_of(instr: &Instr) -> Option<Stream> {
    if matches!(instr, Instr::Free { .. } | Instr::ReportLoss { .. }) {
        return None;
    }
    Some(match instr.group().is_some() || instr.is_transfer() {
        true => Stream::Communication,
        false => Stream::Compute,
    })
}

/// The trace-event JSON object of `events` (`{"traceEvents": [...]}`), with
/// a named process for each of `ranks`.
pub fn chrome_json(events: &[TraceEvent], ranks: &[usize]) -> Value {
    let mut out = Vec::with_capacity(events.len() + 3 * ranks.len());
    // Compute and communication tracks always; the simulator's extra ones where used.
    let mut tracks: std::collections::BTreeSet<(usize, Stream)> = ranks
        .iter()
        .flat_map(|&r| [(r, Stream::Compute), (r, Stream::Communication)])
        .collect();
    for e in events {
        if let TraceEvent::Span { rank, stream, .. } = e {
            tracks.insert((*rank, *stream));
        }
    }
    for &rank in ranks {
        out.push(
            json!({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": format!("rank {rank}")}}),
        );
    }
    for (rank, stream) in tracks {
        let (tid, name) = stream.track();
        out.push(json!({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}}));
    }
    for e in events {
        out.push(match e {
            TraceEvent::Span {
                rank,
                stream,
                name,
                step,
                start_us,
                duration_us,
            } => json!({
                "ph": "X",
                "name": name,
                "cat": stream.track().1,
                "pid": rank,
                "tid": stream.track().0,
                "ts": start_us,
                "dur": duration_us,
                "args": {"step": step},
            }),
            TraceEvent::Memory { rank, at_us, bytes } => json!({
                "ph": "C",
                "name": "activation bytes",
                "pid": rank,
                "ts": at_us,
                "args": {"bytes": bytes},
            }),
        });
    }
    json!({"traceEvents": out, "displayTimeUnit": "ms"})
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_lower::Buf;

    #[test]
    fn spans_and_counters_become_trace_events() {
        let events = [
            TraceEvent::Span {
                rank: 1,
                stream: Stream::Communication,
                name: "send x".into(),
                step: 0,
                start_us: 5.0,
                duration_us: 2.0,
            },
            TraceEvent::Memory {
                rank: 1,
                at_us: 7.0,
                bytes: 64,
            },
        ];
        let v = chrome_json(&events, &[0, 1]);
        let list = v["traceEvents"].as_array().unwrap();
        assert_eq!(list.len(), 6 + 2);
        assert_eq!(list[6]["ph"], "X");
        assert_eq!(list[6]["tid"], 1);
        assert_eq!(list[7]["args"]["bytes"], 64);
        assert_eq!(stream_of(&Instr::Free { buf: Buf::step("w") }), None);
    }
}
