//! CPU placement for a benchmark run: the client's threads on some cores,
//! the server's on others (`--client-cpus`, `--server-cpus`).
//!
//! On a 2-core machine client and server otherwise take each other's core
//! at random moments, and a request's tail is then the other process's
//! time slice, not its own path. Placement is a benchmark setting; the
//! server itself pins nothing.

use std::fmt;
use std::str::FromStr;

use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

/// A set of CPUs, as `taskset -c` spells it: `1`, `0-1`, `0,2-3`.
#[derive(Clone, PartialEq, Eq)]
pub struct Cpus(Vec<usize>);

impl fmt::Debug for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.0.iter().map(usize::to_string).collect();
        f.write_str(&list.join(","))
    }
}

impl FromStr for Cpus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let limit = CpuSet::count();
        let mut cpus = Vec::new();
        for part in s.split(',') {
            let (from, to) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let parse = |v: &str| {
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("`{part}` is not a CPU number or range"))
            };
            let (from, to) = (parse(from)?, parse(to)?);
            if from > to {
                return Err(format!("`{part}`: the range runs backwards"));
            }
            if to >= limit {
                return Err(format!("`{part}`: CPU {to} is beyond {}", limit - 1));
            }
            cpus.extend(from..=to);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(Self(cpus))
    }
}

impl Cpus {
    /// The CPUs, ascending.
    pub fn list(&self) -> &[usize] {
        &self.0
    }

    fn set(&self) -> nix::Result<CpuSet> {
        let mut set = CpuSet::new();
        for cpu in &self.0 {
            set.set(*cpu)?;
        }
        Ok(set)
    }

    /// Pins the calling thread; threads it starts afterwards inherit it.
    pub fn pin_this_thread(&self) -> nix::Result<()> {
        sched_setaffinity(Pid::from_raw(0), &self.set()?)
    }

    /// Pins every thread process `pid` has now; the threads they start
    /// later inherit it.
    pub fn pin_process(&self, pid: u32) -> std::io::Result<()> {
        let set = self.set()?;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let Some(tid) = task?.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            match sched_setaffinity(Pid::from_raw(tid), &set) {
                // A thread that ended meanwhile.
                Err(nix::errno::Errno::ESRCH) => {}
                other => other?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_parse_as_taskset_spells_them() {
        assert_eq!("1".parse::<Cpus>().unwrap(), Cpus(vec![1]));
        assert_eq!("0-1".parse::<Cpus>().unwrap(), Cpus(vec![0, 1]));
        assert_eq!("3,0-1,1".parse::<Cpus>().unwrap(), Cpus(vec![0, 1, 3]));
        assert_eq!("0,2-3".parse::<Cpus>().unwrap().to_string(), "0,2,3");
        for bad in ["", "a", "1-", "2-1", "0,,1", "99999"] {
            assert!(bad.parse::<Cpus>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn pinning_a_process_pins_every_thread_it_has() {
        // A real process with several threads: this test binary's own
        // threads would be shared with other tests, so a child.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let cpu0: Cpus = "0".parse().unwrap();
        cpu0.pin_process(child.id()).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_owned();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(allowed, "0");
    }

    #[test]
    fn pinning_this_thread_shows_in_its_affinity() {
        // On a thread of its own, so the test runner's threads keep theirs.
        std::thread::spawn(|| {
            let cpu0: Cpus = "0".parse().unwrap();
            cpu0.pin_this_thread().unwrap();
            let now = nix::sched::sched_getaffinity(Pid::from_raw(0)).unwrap();
            assert!(now.is_set(0).unwrap());
            assert!(!now.is_set(1).unwrap());
            // Threads started afterwards inherit it.
            std::thread::spawn(|| {
                let child = nix::sched::sched_getaffinity(Pid::from_raw(0)).unwrap();
                assert!(!child.is_set(1).unwrap());
            })
            .join()
            .unwrap();
        })
        .join()
        .unwrap();
    }
}
