//! The standard `process_*` series (CPU time, resident and virtual memory,
//! open and allowed file descriptors, threads, start time), read from
//! `/proc/self` on every scrape and appended to each binary's `/metrics`
//! without the service prefix, under the names Prometheus client libraries
//! use, so stock dashboards and alerts work unchanged.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `USER_HZ`: the unit of the CPU times in `/proc/<pid>/stat`. It is fixed by
/// the kernel's user ABI (not the kernel's tick rate) at 100 on every Linux
/// architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// One reading of the process's resource use.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: u64,
    /// Threads in the process.
    pub threads: u64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// File descriptors open now.
    pub open_fds: u64,
    /// The soft limit on open file descriptors (`None`: unlimited).
    pub max_fds: Option<u64>,
}

impl ProcessStats {
    /// Reads `/proc/self`; `None` where there is no procfs (not Linux) or it
    /// cannot be parsed.
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        // The directory handle used to list fds is itself one of them.
        let open_fds = open_fds.saturating_sub(1);
        Self::parse(&stat, &status, &boot, &limits, open_fds)
    }

    /// Builds a reading from the text of `/proc/self/stat`, `/proc/self/status`,
    /// `/proc/stat` and `/proc/self/limits`.
    pub fn parse(
        stat: &str,
        status: &str,
        boot: &str,
        limits: &str,
        open_fds: u64,
    ) -> Option<Self> {
        // The command name (field 2) is in parentheses and may hold spaces
        // or parentheses itself: the fields that follow start after the last ')'.
        let after_comm = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        // `fields[0]` is field 3 (state): field n is fields[n - 3].
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        let ticks = field(14)? + field(15)?;
        let start_ticks = field(22)?;
        let boot_seconds: u64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let resident_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let max_fds = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse().ok());
        Some(Self {
            cpu_seconds: ticks as f64 / TICKS_PER_SECOND,
            resident_bytes: resident_kib * 1024,
            virtual_bytes: field(23)?,
            threads: field(20)?,
            start_time_seconds: boot_seconds as f64 + start_ticks as f64 / TICKS_PER_SECOND,
            open_fds,
            max_fds,
        })
    }

    /// A registry (no prefix) holding this reading as the standard series.
    pub fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        let cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        cpu.inc_by(self.cpu_seconds);
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            cpu,
        );
        let gauge = |value: u64| {
            let g = Gauge::<i64>::default();
            g.set(i64::try_from(value).unwrap_or(i64::MAX));
            g
        };
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            gauge(self.resident_bytes),
        );
        registry.register(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            gauge(self.virtual_bytes),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            gauge(self.open_fds),
        );
        if let Some(max) = self.max_fds {
            registry.register(
                "process_max_fds",
                "Maximum number of open file descriptors",
                gauge(max),
            );
        }
        registry.register(
            "process_threads",
            "Number of OS threads",
            gauge(self.threads),
        );
        let start = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        start.set(self.start_time_seconds);
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            start,
        );
        registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (ic index (x)) S 1 4242 4242 0 -1 4194560 3000 0 0 0 \
        250 125 0 0 20 0 9 0 12300 987654321 2048 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
    const STATUS: &str =
        "Name:\tic-index-server\nVmPeak:\t  999 kB\nVmRSS:\t    8192 kB\nThreads:\t9\n";
    const BOOT: &str = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units\n\
        Max cpu time              unlimited            unlimited            seconds\n\
        Max open files            1048576              1048576              files\n";

    #[test]
    fn parses_the_proc_files() {
        let stats = ProcessStats::parse(STAT, STATUS, BOOT, LIMITS, 17).unwrap();
        assert_eq!(
            stats,
            ProcessStats {
                cpu_seconds: 3.75,
                resident_bytes: 8192 * 1024,
                virtual_bytes: 987_654_321,
                threads: 9,
                start_time_seconds: 1_700_000_123.0,
                open_fds: 17,
                max_fds: Some(1_048_576),
            }
        );
    }

    #[test]
    fn unlimited_fds_and_garbage_are_handled() {
        let unlimited = LIMITS.replace("1048576              1048576", "unlimited unlimited");
        let stats = ProcessStats::parse(STAT, STATUS, BOOT, &unlimited, 3).unwrap();
        assert_eq!(stats.max_fds, None);
        assert_eq!(
            ProcessStats::parse("garbage", STATUS, BOOT, LIMITS, 3),
            None
        );
        assert_eq!(ProcessStats::parse(STAT, STATUS, "", LIMITS, 3), None);
    }

    #[test]
    fn this_process_is_read() {
        let stats = ProcessStats::read().expect("procfs on Linux");
        assert!(
            stats.resident_bytes > 0 && stats.threads >= 1 && stats.open_fds >= 3,
            "{stats:?}"
        );
    }
}
