//! Unary `Schedule` measured by a client that is not ours: nghttp2's
//! `h2load` (Debian's `nghttp2-client`), a C load generator that spends a
//! fraction of what the bench's tonic callers do per call, so that on a
//! small machine more of it is left to the server. Each of its clients is
//! a connection with one call in flight, sending the same request (a
//! gRPC-framed `ScheduleRequest`; the server makes each message's id).
//! h2load cannot read gRPC's status, which comes in trailers: the run
//! counts as done only if the server's pending count grew by every call.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, bail};
use hourglass_testkit::ServerProcess;
use prost::Message as _;

use crate::{load::Run, workload::Workload};

/// The command, as the docs give it for reproduction.
pub const COMMAND: &str = "h2load";

/// Whether `h2load` is installed.
pub fn installed() -> bool {
    Command::new(COMMAND).arg("--version").output().is_ok_and(|out| out.status.success())
}

/// `calls` unary `Schedule` calls of record 0 of `w`, due at `due_ms`, from
/// `clients` connections with one call in flight each; the calls' request
/// file and log go under `dir`.
pub async fn unary(
    server: &ServerProcess,
    w: &Workload,
    calls: usize,
    clients: usize,
    due_ms: u64,
    dir: &Path,
) -> anyhow::Result<Run> {
    let request = w.at(0, due_ms).encode_to_vec();
    let mut framed = Vec::with_capacity(request.len() + 5);
    framed.push(0); // not compressed
    framed.extend_from_slice(&u32::try_from(request.len())?.to_be_bytes());
    framed.extend_from_slice(&request);
    let (body, log) = (dir.join("h2load-request.bin"), dir.join("h2load.log"));
    std::fs::write(&body, framed).context("writing h2load's request")?;

    let pending = server.metric("hourglass_messages_pending").await?;
    let url = format!("http://{}/hourglass.v1.Scheduler/Schedule", server.grpc);
    let mut args: Vec<String> = vec![
        "-n".into(),
        calls.to_string(),
        "-c".into(),
        clients.to_string(),
        "-m".into(),
        "1".into(),
        "-t".into(),
        "1".into(),
        "-d".into(),
        body.display().to_string(),
        "-H".into(),
        "content-type: application/grpc".into(),
        "-H".into(),
        "te: trailers".into(),
        "--log-file".into(),
        log.display().to_string(),
    ];
    if w.traced {
        // One trace for every call: the server makes a span per call all
        // the same.
        args.extend(["-H".into(), format!("traceparent: {}", crate::otlp::traceparent().to_str()?)]);
    }
    args.push(url);
    let out = tokio::task::spawn_blocking(move || Command::new(COMMAND).args(&args).output())
        .await?
        .context("running h2load")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("h2load failed ({}): {}{}", out.status, stdout, String::from_utf8_lossy(&out.stderr));
    }
    let run = parse(&stdout, &std::fs::read_to_string(&log).context("reading h2load's log")?)?;
    anyhow::ensure!(run.messages == calls, "h2load answered {} of {calls} calls: {stdout}", run.messages);
    let grown = server.metric("hourglass_messages_pending").await? - pending;
    anyhow::ensure!(
        grown as usize == calls,
        "h2load's {calls} calls parked {grown} messages: some were refused (gRPC's status is in trailers, which \
         h2load does not read)"
    );
    Ok(run)
}

/// The run h2load's summary (`stdout`) and per-call log describe: calls
/// answered 2xx, the time from the first call's start to the last call's
/// answer, each call's time.
fn parse(stdout: &str, log: &str) -> anyhow::Result<Run> {
    let mut run = Run::default();
    let (mut first, mut last) = (u64::MAX, 0u64);
    for line in log.lines() {
        // start (µs since the epoch), HTTP status, µs until the answer
        let mut cols = line.split('\t').map(str::trim);
        let (Some(start), Some(status), Some(took)) = (cols.next(), cols.next(), cols.next()) else {
            bail!("h2load's log line {line:?} is not start, status, duration");
        };
        let (start, took): (u64, u64) =
            (start.parse().context("h2load's start")?, took.parse().context("h2load's duration")?);
        if !status.starts_with('2') {
            continue;
        }
        first = first.min(start);
        last = last.max(start + took);
        run.latencies.push(Duration::from_micros(took));
        run.messages += 1;
    }
    if run.messages == 0 {
        bail!("h2load logged no answered call: {stdout}");
    }
    run.elapsed = Duration::from_micros(last - first);
    run.latencies.sort_unstable();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_read_as_rate_and_latencies() {
        let log = "1000000\t200\t1500\n1000100\t200\t900\n1000200\t503\t10\n1001000\t200\t1000\n";
        let run = parse("", log).unwrap();
        assert_eq!(run.messages, 3, "a call answered 503 is not counted");
        assert_eq!(run.elapsed, Duration::from_micros(2000), "from the first start to the last answer");
        assert_eq!(run.latencies, [900, 1000, 1500].map(Duration::from_micros));
        assert!(parse("", "").is_err(), "nothing answered is an error");
        assert!(parse("", "1\t200\n").is_err(), "a short line is an error");
    }
}
