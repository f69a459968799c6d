//! What the bench ran on, printed with every result.

use std::{path::Path, process::Command};

use serde::Serialize;

#[derive(Debug, Default, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_bytes: u64,
    /// The device, filesystem and kind of disk under the store.
    pub disk: String,
    pub kernel: String,
}

impl Machine {
    pub fn describe(store_dir: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu: cpuinfo
                .lines()
                .find_map(|l| {
                    l.strip_prefix("model name")
                        .and_then(|r| r.split_once(':'))
                        .map(|(_, v)| v.trim().to_owned())
                })
                .unwrap_or_else(|| "unknown CPU".into()),
            memory_bytes: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024),
            disk: disk(store_dir),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|k| format!("Linux {}", k.trim()))
                .unwrap_or_else(|_| std::env::consts::OS.into()),
        }
    }
}

fn disk(dir: &Path) -> String {
    let out = Command::new("df").args(["--output=source,fstype,size"]).arg(dir).output();
    let Ok(out) = out else { return "unknown".into() };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(line) = text.lines().nth(1) else { return "unknown".into() };
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (source, fstype) = (fields.first().copied().unwrap_or("?"), fields.get(1).copied().unwrap_or("?"));
    let device = source.trim_start_matches("/dev/");
    let base: String = device.trim_end_matches(|c: char| c.is_ascii_digit()).to_owned();
    let rotational = [device, base.as_str(), base.trim_end_matches('p')]
        .iter()
        .find_map(|d| std::fs::read_to_string(format!("/sys/block/{d}/queue/rotational")).ok())
        .map(|r| if r.trim() == "1" { "reported rotational" } else { "reported non-rotational" })
        .unwrap_or("kind unknown");
    format!("{source} ({fstype}, {rotational}) at {}", dir.display())
}
