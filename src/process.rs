//! The `process_*` metrics Prometheus client libraries share (memory, CPU, file
//! descriptors, start time), read from `/proc/self` at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// What one look at `/proc/self` found; a figure that could not be read is `None` and its
/// series is left out of that scrape.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// Resident set size, bytes.
    pub resident_bytes: Option<f64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: Option<f64>,
    /// User and system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<f64>,
    /// The soft limit of open file descriptors.
    pub max_fds: Option<f64>,
    /// When the process started, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
}

/// Reads `/proc/self`: `status` for memory (kB, so no page size is needed), `stat` for CPU
/// ticks and the start in ticks after boot, `/proc/stat` for the boot time, `limits` and
/// the `fd` folder for descriptors. Outside Linux every figure is `None`.
pub fn read_stats() -> ProcessStats {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let ticks = ticks_per_second();
    let stat = read("/proc/self/stat").and_then(|s| parse_stat(&s));
    let boot = read("/proc/stat").and_then(|s| parse_boot_time(&s));
    let (resident, virt) = read("/proc/self/status")
        .map(|s| parse_status(&s))
        .unwrap_or_default();
    ProcessStats {
        resident_bytes: resident,
        virtual_bytes: virt,
        cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / ticks),
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64),
        max_fds: read("/proc/self/limits").and_then(|s| parse_max_fds(&s)),
        start_time_seconds: stat
            .zip(boot)
            .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / ticks),
    }
}

/// The kernel's clock tick for `stat` times (`USER_HZ`): 100 on every Linux platform
/// hookgate runs on, a constant of the kernel's interface. Not asked of the auxiliary
/// vector: under valgrind (`bench/cost-model.sh`) that read faults on the vDSO address
/// valgrind passes on, and the first scrape of `/metrics` ended the process.
fn ticks_per_second() -> f64 {
    100.0
}

/// The fields of `/proc/self/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
}

/// Parses `/proc/self/stat`. The command name (field 2) is in parentheses and may hold
/// spaces or parentheses itself, so the fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
    })
}

/// `VmRSS` and `VmSize` of `/proc/self/status`, in bytes.
fn parse_status(text: &str) -> (Option<f64>, Option<f64>) {
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|k| k * 1024.0)
    };
    (kib("VmRSS:"), kib("VmSize:"))
}

/// `btime` of `/proc/stat`: the boot time, seconds since the Unix epoch.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn parse_max_fds(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The collector registered without hookgate's prefix: the names are the ones every
/// Prometheus client library exports, so shared dashboards and alerts find them.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = read_stats();
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stats.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stats.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                stats.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                stats.max_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                stats.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                ConstGauge::new(value).encode(metric)?;
            }
        }
        if let Some(cpu) = stats.cpu_seconds {
            // The counter's `_total` suffix is added by the encoder.
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(cpu).encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        // A command name with a space and a parenthesis, as a process may name itself.
        let line = "4242 (hook gate) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0 123456 104857600 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                start_ticks: 123456
            })
        );
        assert_eq!(parse_stat("4242 (cut short) S 1"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn status_limits_and_boot_time_are_read_from_their_lines() {
        let status =
            "Name:\thookgate\nVmPeak:\t  200000 kB\nVmSize:\t  102400 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(
            parse_status(status),
            (Some(2048.0 * 1024.0), Some(102400.0 * 1024.0))
        );
        assert_eq!(parse_status("Name:\tkthread\n"), (None, None));
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax cpu time              unlimited            unlimited            seconds   \nMax open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024.0));
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1764547200\nprocesses 9\n"),
            Some(1_764_547_200)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_as_itself() {
        let stats = read_stats();
        let rss = stats.resident_bytes.expect("VmRSS");
        assert!(rss > 0.0 && rss <= stats.virtual_bytes.expect("VmSize"));
        let open = stats.open_fds.expect("fds");
        assert!(open >= 1.0 && open <= stats.max_fds.expect("limit"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let start = stats.start_time_seconds.expect("start");
        // The test binary started moments ago; a tick's rounding either way.
        assert!(
            start <= now + 1.0 && start > now - 3_600.0,
            "{start} vs {now}"
        );
    }
}
