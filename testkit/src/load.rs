//! Load from `wrk` (Debian's package), for the benchmarks: a URL asked by 2 threads over 32
//! connections for a while, and what it measured.

use std::path::PathBuf;
use std::process::Command;

/// What `wrk` measured.
#[derive(Clone, Copy)]
pub struct Load {
    /// Requests per second.
    pub rps: f64,
    /// The median latency.
    pub p50_ms: f64,
    /// The 99th percentile latency.
    pub p99_ms: f64,
}

/// `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// `wrk -t2 -c32 -d{duration} --latency url`, parsed; `None` (said) when it failed or had
/// answers other than 2xx.
pub fn wrk(url: &str, duration: &str) -> Option<Load> {
    let out = Command::new("wrk")
        .args(["-t2", "-c32", &format!("-d{duration}"), "--latency", url])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |label: &str| -> Option<&str> {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(label))
            .map(str::trim)
    };
    if text.contains("Non-2xx") {
        println!("{url}: answers other than 2xx:\n{text}");
        return None;
    }
    Some(Load {
        rps: field("Requests/sec:")?.parse().ok()?,
        p50_ms: millis(field("50%")?)?,
        p99_ms: millis(field("99%")?)?,
    })
}

/// `wrk`'s `1.23ms`, `456.00us` or `1.02s`, in milliseconds.
fn millis(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}
