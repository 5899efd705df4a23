//! Ring all-reduce of f32 buffers between 2 and 4 ranks, with every rank a
//! thread of one process (shared mailboxes) and with every rank on its own
//! TCP endpoint over loopback (as separate processes under a launcher talk),
//! at sizes from 256 KiB to 64 MiB. Prints the median time of a few
//! all-reduces and the bus bandwidth, 2(n−1)/n · bytes / time, the figure
//! NCCL's tests report, so the two fabrics and the cost model's link
//! figures can be set side by side.
//!
//! Run with `cargo bench -p autopar-comm --bench collectives`.

use autopar_comm::collective::{connect, fabric, Algorithm, Buffer, Endpoint};
use autopar_comm::launch::LaunchEnv;
use std::time::{Duration, Instant};

const REPEATS: usize = 5;
const TIMEOUT: Duration = Duration::from_secs(60);

/// The endpoints of `world` ranks on loopback TCP, connected from one thread each.
fn tcp(world: usize) -> Vec<Endpoint> {
    let port = autopar_comm::launch::loopback_test_port().expect("a loopback port");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| s.spawn(move || connect(&LaunchEnv::loopback(rank, world, port), TIMEOUT, TIMEOUT)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("connecting").expect("a loopback mesh"))
            .collect()
    })
}

/// Median seconds of one all-reduce of `elements` f32 over `endpoints`
/// (the buffers are made before the clock starts).
fn time(endpoints: &[Endpoint], elements: usize) -> f64 {
    let group: Vec<usize> = (0..endpoints.len()).collect();
    let mut times: Vec<f64> = (0..REPEATS + 1)
        .map(|round| {
            let inputs: Vec<Buffer> = endpoints
                .iter()
                .map(|_| Buffer::F32(vec![1.0; elements]))
                .collect();
            let tag = format!("bench/{round}");
            let start = Instant::now();
            std::thread::scope(|s| {
                for (ep, mut data) in endpoints.iter().zip(inputs) {
                    let (group, tag) = (&group, &tag);
                    s.spawn(move || {
                        ep.all_reduce(group, &mut data, Algorithm::Ring, tag, "bench all-reduce")
                            .expect("all-reduce");
                    });
                }
            });
            start.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    println!("ring all-reduce of f32, median of {REPEATS}; bus bandwidth = 2(n-1)/n * bytes / time");
    println!("  ranks  fabric       size      time_ms   bus_GB/s");
    for world in [2, 4] {
        let fabrics = [("threads", fabric(world, TIMEOUT)), ("tcp", tcp(world))];
        for (name, endpoints) in &fabrics {
            for mib in [0.25, 4.0, 64.0] {
                let bytes = (mib * 1024.0 * 1024.0) as usize;
                let seconds = time(endpoints, bytes / 4);
                let bus = 2.0 * (world - 1) as f64 / world as f64 * bytes as f64 / seconds / 1e9;
                println!(
                    "  {world:>5}  {name:<8}  {:>6} MiB  {:>9.2}  {:>9.2}",
                    mib,
                    seconds * 1e3,
                    bus
                );
            }
        }
        // Each rank closes on its own thread: closing waits for the peers' goodbyes.
        std::thread::scope(|s| {
            for ep in fabrics.iter().flat_map(|(_, endpoints)| endpoints) {
                s.spawn(move || ep.close(TIMEOUT).expect("closing"));
            }
        });
    }
}
