//! Numbers for people: bytes, seconds and FLOP rates with fitting units.

/// Bytes in binary units (GiB, MiB, KiB).
pub fn binary(bytes: f64) -> String {
    const UNITS: [(f64, &str); 3] = [(1_073_741_824.0, "GiB"), (1_048_576.0, "MiB"), (1024.0, "KiB")];
    UNITS.iter().find(|(scale, _)| bytes >= *scale).map_or_else(
        || format!("{bytes:.0} B"),
        |(scale, unit)| format!("{:.1} {unit}", bytes / scale),
    )
}

/// FLOP/s with a metric prefix (TFLOP/s, GFLOP/s, ...).
pub fn flop_rate(x: f64) -> String {
    const UNITS: [(f64, &str); 4] = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")];
    UNITS.iter().find(|(scale, _)| x >= *scale).map_or_else(
        || format!("{x:.0} FLOP/s"),
        |(scale, p)| format!("{:.1} {p}FLOP/s", x / scale),
    )
}

/// Seconds in ms or µs when small.
pub fn seconds(t: f64) -> String {
    if t >= 1.0 {
        format!("{t:.3} s")
    } else if t >= 1e-3 {
        format!("{:.3} ms", t * 1e3)
    } else {
        format!("{:.3} µs", t * 1e6)
    }
}
