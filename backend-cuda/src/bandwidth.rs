//! NCCL all-reduce bandwidth between the GPUs of a launched job, for
//! `autopar profile --backend cuda` under a launcher. Two levels, as the
//! cost model prices them: inside a node (each node's ranks in one ring)
//! and between nodes (the ranks at the same place on each node in one
//! ring, every ring at once, as data parallelism across nodes runs them).
//! A rate is the bytes each rank sends per second, the communication
//! model's `2 (p - 1) / p × size / time` of a ring, and a level's figure is
//! its slowest ring's.

use super::device_comms::{CommsError, DeviceComms, DeviceOp};
use super::nccl::{self, decode_bytes, encode_bytes, DataType, Link, Nccl};
use super::{device, CudaError, NetworkProfile};
use autopar_comm::collective::{Algorithm, Buffer, Endpoint, Watchdog};
use cudarc::driver::{CudaStream, DevicePtr};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

/// Longest host name exchanged (Linux allows 64 bytes).
const HOST_BYTES: usize = 64;

/// Measures the job's NCCL bandwidth from this process's GPU `ordinal`.
/// Every process of the job calls it at the same point; each gets the
/// same figures. A job where NCCL cannot run (a GPU shared by two ranks,
/// no library) gets no figures and says why.
pub(crate) fn profile_network(
    ordinal: usize,
    ep: &Endpoint,
    quick: bool,
) -> Result<NetworkProfile, CudaError> {
    let ctx = device::context(ordinal)?;
    let hosts = job_hosts(ep)?;
    let (intra, inter) = rings(&hosts);
    let groups: BTreeSet<Vec<usize>> = intra.iter().chain(&inter).cloned().collect();
    let nccl = match nccl::open(ep, &groups, None, &ctx)? {
        Link::Nccl(nccl) => nccl,
        Link::Staged(why) => return Ok(NetworkProfile::unmeasured(format!("NCCL cannot run here: {why}"))),
        Link::Alone => return Ok(NetworkProfile::unmeasured("a job of one process".into())),
    };
    // A rank that fails ends its peers' NCCL waits on the GPU.
    let comms = nccl.comms();
    let _watchdog = Watchdog::spawn(ep.clone(), move |by, why| comms.abort(by, &why));
    let stream = ctx
        .new_stream()
        .map_err(CommsError::driver("making the bandwidth test's stream"))?;
    let elements = if quick { 1 << 18 } else { 1 << 26 };
    let calls = if quick { 2 } else { 10 };
    let buffer = stream
        .alloc_zeros::<f32>(elements)
        .map_err(CommsError::driver("allocating the bandwidth test's buffer"))?;
    let ptr = buffer.device_ptr(&stream).0;
    let everyone: Vec<usize> = (0..ep.world()).collect();
    let mut mine = Vec::new();
    for (level, level_rings) in [&intra, &inter].into_iter().enumerate() {
        // Every ring of a level starts together, as they would in a run.
        let mut start = Buffer::F64(vec![0.0]);
        ep.all_reduce(
            &everyone,
            &mut start,
            Algorithm::Ring,
            &format!("profile/start/{level}"),
            "starting a bandwidth test",
        )
        .map_err(CommsError::from)?;
        let rate = match level_rings.iter().find(|r| r.contains(&ep.rank())) {
            Some(ring) => ring_rate(&nccl, ring, (ptr, elements), &stream, calls)?,
            None => 0.0,
        };
        mine.push(rate);
    }
    let rows = ep
        .all_gather(
            &everyone,
            &Buffer::F64(mine),
            "profile/rates",
            "sharing measured bandwidths",
        )
        .map_err(CommsError::from)?;
    let Buffer::F64(rows) = rows else {
        return Err(CommsError::ArrivedAsF32("the measured bandwidths".into()).into());
    };
    let slowest = |level: usize| {
        rows.chunks(2)
            .map(|row| row[level])
            .filter(|&r| r > 0.0)
            .min_by(f64::total_cmp)
    };
    let nodes = hosts.iter().collect::<BTreeSet<_>>().len();
    Ok(NetworkProfile {
        intra_node_bytes_per_s: slowest(0),
        inter_node_bytes_per_s: slowest(1),
        about: format!(
            "{} ring all-reduces of {} MiB over {} processes on {nodes} node{} ({} inside nodes, {} between)",
            nccl.version(),
            (elements * 4) >> 20,
            hosts.len(),
            if nodes == 1 { "" } else { "s" },
            count(intra.len(), "ring"),
            count(inter.len(), "ring"),
        ),
    })
}

fn count(n: usize, what: &str) -> String {
    match n {
        0 => format!("no {what}s"),
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

/// Bytes this rank sends per second in `calls` all-reduces of the f32
/// buffer at `ptr` over `ring`, after one to warm up.
fn ring_rate(
    nccl: &Nccl,
    ring: &[usize],
    (ptr, elements): (u64, usize),
    stream: &Arc<CudaStream>,
    calls: usize,
) -> Result<f64, CommsError> {
    let call = || {
        nccl.collective(
            DeviceOp::AllReduce(ptr).over(ring, elements, DataType::ncclFloat32),
            stream,
        )
    };
    let sync = || {
        stream
            .synchronize()
            .map_err(CommsError::driver("waiting for the bandwidth test"))
    };
    call()?;
    sync()?;
    let began = Instant::now();
    for _ in 0..calls {
        call()?;
    }
    sync()?;
    let seconds = began.elapsed().as_secs_f64() / calls as f64;
    let p = ring.len() as f64;
    Ok(2.0 * (p - 1.0) / p * (elements * 4) as f64 / seconds)
}

/// Every rank's host name, in rank order.
fn job_hosts(ep: &Endpoint) -> Result<Vec<String>, CommsError> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .map_err(|_| CommsError::UnknownHost)?;
    let mut bytes = name.into_bytes();
    bytes.resize(HOST_BYTES, 0);
    let everyone: Vec<usize> = (0..ep.world()).collect();
    let all = ep.all_gather(
        &everyone,
        &Buffer::F64(encode_bytes(&bytes)),
        "profile/hosts",
        "sharing host names",
    )?;
    let Buffer::F64(words) = all else {
        return Err(CommsError::ArrivedAsF32("the host names".into()));
    };
    words
        .chunks(HOST_BYTES / 4)
        .map(|w| {
            let bytes = decode_bytes(w, HOST_BYTES)?;
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
        })
        .collect()
}

/// The rings of each level from every rank's host: each node's ranks
/// (inside nodes), and the ranks at the same place on each node (between
/// nodes); rings of one rank are left out.
fn rings(hosts: &[String]) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
    let mut nodes: Vec<(&str, Vec<usize>)> = Vec::new();
    for (rank, host) in hosts.iter().enumerate() {
        match nodes.iter_mut().find(|(h, _)| *h == host) {
            Some((_, ranks)) => ranks.push(rank),
            None => nodes.push((host, vec![rank])),
        }
    }
    let intra = nodes
        .iter()
        .map(|(_, ranks)| ranks.clone())
        .filter(|r| r.len() > 1)
        .collect();
    let widest = nodes.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
    let inter = (0..widest)
        .map(|place| {
            nodes
                .iter()
                .filter_map(|(_, r)| r.get(place).copied())
                .collect::<Vec<_>>()
        })
        .filter(|r| r.len() > 1)
        .collect();
    (intra, inter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_node_has_one_ring_inside_and_none_between() {
        let (intra, inter) = rings(&hosts(&["a", "a", "a", "a"]));
        assert_eq!(intra, vec![vec![0, 1, 2, 3]]);
        assert!(inter.is_empty());
    }

    #[test]
    fn nodes_ring_inside_and_each_place_rings_between() {
        // Two nodes of two GPUs, ranks interleaved as a round-robin launcher places them.
        let (intra, inter) = rings(&hosts(&["a", "b", "a", "b"]));
        assert_eq!(intra, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(inter, vec![vec![0, 1], vec![2, 3]]);
        // One GPU per node: no ring inside; uneven nodes ring where they can.
        let (intra, inter) = rings(&hosts(&["a", "b", "c"]));
        assert!(intra.is_empty());
        assert_eq!(inter, vec![vec![0, 1, 2]]);
        let (intra, inter) = rings(&hosts(&["a", "a", "a", "b"]));
        assert_eq!(intra, vec![vec![0, 1, 2]]);
        assert_eq!(inter, vec![vec![0, 3]]);
    }

    /// Every rank gets every rank's host name, padding dropped.
    #[test]
    fn host_names_are_exchanged() {
        let endpoints = autopar_comm::collective::fabric(3, std::time::Duration::from_secs(5));
        let names: Vec<Vec<String>> = std::thread::scope(|s| {
            let ranks: Vec<_> = endpoints
                .iter()
                .map(|ep| s.spawn(|| job_hosts(ep).unwrap()))
                .collect();
            ranks.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let here = &names[0];
        assert_eq!(here.len(), 3);
        assert!(
            here.iter()
                .all(|n| n == &here[0] && !n.is_empty() && !n.contains('\0')),
            "{here:?}"
        );
        assert!(names.iter().all(|n| n == here));
        assert_eq!(rings(here), (vec![vec![0, 1, 2]], Vec::<Vec<usize>>::new()));
    }
}
