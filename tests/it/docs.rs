//! The docs run as written: every shell block of README.md and docs/*.md is
//! run by bash, in page order, against what the page says it runs on (the
//! local scripts a reader starts), and what a page shows as a command's
//! output is what the command prints.
//!
//! A page's first line names its setup: `<!-- docs-test: run.sh -->` (a
//! fresh `bash deploy/local/run.sh` before the page's blocks), `cluster.sh`
//! (a fresh `bash deploy/local/cluster.sh`), or `none` (the page's own
//! blocks start what they need). Fenced blocks:
//!
//! - ```` ```sh ````: run from the repository's root, in a shell of its
//!   own; must exit 0. `exit=N` after `sh`: must exit N.
//! - `sh background`: started and left running, as in a second terminal;
//!   the next block runs once it is ready (a script's `ready:` line, or any
//!   first line of output). At the page's end it gets a Ctrl-C (SIGINT to
//!   its process group, as a terminal sends) and must exit 0. Starting
//!   run.sh or cluster.sh stops the one started before (they share ports),
//!   as a reader stops one before starting the other.
//! - `sh skip`: not run (Kubernetes, Docker, the test suite itself).
//! - A block right after a `sh` block whose info string's second word is
//!   `output` is what that block prints, stdout and stderr together: each
//!   line as shown, `[..]` standing for any text within a line and a line
//!   `...` for any lines.
//!
//! Each page runs in a directory of its own whose entries link to the
//! repository's, with its own `.local` (the scripts' state), this build's
//! `hourglass` (HOURGLASS_BIN, so nothing is built in release mode here)
//! and a `bin/` first on the PATH that the scripts link `hourglass` into.
//! The scripts use their fixed ports (Kafka 9092, gRPC 50051-50053,
//! metrics 9464-9466), so the pages run one at a time. Scripts start with
//! the signals they handle at their defaults, whatever the suite inherited
//! (a background job ignores SIGINT), and whatever was started for a page
//! (found by a mark in its environment) is killed when the page's
//! directory goes, so a failing page never holds the next one's ports.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The pages, each with the test that runs it.
const PAGES: &[&str] = &[
    "README.md",
    "docs/API.md",
    "docs/CONFIGURATION.md",
    "docs/OPERATIONS.md",
    "docs/ARCHITECTURE.md",
    "docs/CLUSTER.md",
    "docs/RELIABILITY.md",
    "docs/BENCHMARKS.md",
];

/// One page at a time: they share the scripts' ports.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    None,
    RunSh,
    ClusterSh,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// Run; must exit with this code.
    Run(i32),
    Background,
    Skip,
}

#[derive(Debug, Clone)]
struct Block {
    line: usize,
    code: String,
    kind: Kind,
    output: Option<String>,
}

#[derive(Debug)]
struct Page {
    setup: Setup,
    blocks: Vec<Block>,
}

/// Reads a page's setup and its shell blocks, each with the output shown
/// for it.
fn parse_page(text: &str) -> Result<Page, String> {
    let setup = match text.lines().next().map(str::trim) {
        Some("<!-- docs-test: run.sh -->") => Setup::RunSh,
        Some("<!-- docs-test: cluster.sh -->") => Setup::ClusterSh,
        Some("<!-- docs-test: none -->") => Setup::None,
        other => {
            return Err(format!(
                "the first line must be <!-- docs-test: run.sh|cluster.sh|none -->, not {other:?}"
            ));
        }
    };
    // Every fenced block: its first line's number, info string and body;
    // and whether only blank lines stood between it and the block before.
    let mut fenced: Vec<(usize, String, String, bool)> = Vec::new();
    let mut open: Option<(usize, String, String, bool)> = None;
    let mut after_block = false;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some((start, info, mut body, adjacent)) = open.take() {
            if trimmed.trim_end() == "```" {
                fenced.push((start, info, body, adjacent));
                after_block = true;
            } else {
                body.push_str(line);
                body.push('\n');
                open = Some((start, info, body, adjacent));
            }
            continue;
        }
        if trimmed.starts_with("~~~") || trimmed.starts_with("````") {
            return Err(format!(
                "line {}: fence blocks with three backticks, so that the test reads them",
                n + 1
            ));
        }
        if let Some(info) = trimmed.strip_prefix("```") {
            open = Some((n + 1, info.trim().to_owned(), String::new(), after_block));
        } else if !line.trim().is_empty() {
            after_block = false;
        }
    }
    let mut blocks: Vec<Block> = Vec::new();
    let mut last_was_sh = false;
    for (line, info, body, adjacent) in fenced {
        let words: Vec<&str> = info.split_whitespace().collect();
        if words.get(1) == Some(&"output") {
            let block =
                blocks.last_mut().filter(|b| last_was_sh && adjacent && matches!(b.kind, Kind::Run(_)));
            let Some(block) = block else {
                return Err(format!(
                    "line {line}: an output block must follow the sh block it shows, one that is run"
                ));
            };
            block.output = Some(body);
            last_was_sh = false;
            continue;
        }
        last_was_sh = words.first() == Some(&"sh");
        if !last_was_sh {
            let shell_like =
                |w: &&str| w.starts_with("sh") || matches!(*w, "bash" | "zsh" | "shell" | "console");
            if words.first().is_some_and(shell_like) {
                return Err(format!("line {line}: write shell blocks as ```sh, so that they are run"));
            }
            continue;
        }
        let mut kind = Kind::Run(0);
        for word in &words[1..] {
            kind = match *word {
                "background" => Kind::Background,
                "skip" => Kind::Skip,
                w if w.starts_with("exit=") => Kind::Run(
                    w["exit=".len()..].parse().map_err(|_| format!("line {line}: {w} is not exit=N"))?,
                ),
                w => return Err(format!("line {line}: {w:?} is not background, skip or exit=N")),
            };
        }
        blocks.push(Block { line, code: body, kind, output: None });
    }
    Ok(Page { setup, blocks })
}

/// Whether `actual` is what `expected` shows: line by line, trailing
/// spaces and blank lines at the end aside, `[..]` any text in a line, a
/// line `...` any lines.
fn matches_output(expected: &str, actual: &str) -> bool {
    fn lines(text: &str) -> Vec<&str> {
        let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        while lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        lines
    }
    fn line_matches(pattern: &str, line: &str) -> bool {
        let mut parts = pattern.split("[..]");
        let first = parts.next().unwrap_or_default();
        let Some(mut rest) = line.strip_prefix(first) else { return false };
        let parts: Vec<&str> = parts.collect();
        for (i, part) in parts.iter().enumerate() {
            if i == parts.len() - 1 {
                return rest.ends_with(part);
            }
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.is_empty()
    }
    fn from(p: &[&str], a: &[&str]) -> bool {
        match p.split_first() {
            None => a.is_empty(),
            Some((&"...", more)) => (0..=a.len()).any(|skip| from(more, &a[skip..])),
            Some((pattern, more)) => {
                a.first().is_some_and(|line| line_matches(pattern, line)) && from(more, &a[1..])
            }
        }
    }
    from(&lines(expected), &lines(actual))
}

/// A process started in a process group of its own, its output going to
/// a file.
struct Running {
    what: String,
    child: Child,
    log: PathBuf,
}

impl Running {
    fn start(dir: &Path, env: &[(String, String)], code: &str, log: PathBuf) -> Running {
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("bash")
            .args(["-e", "-o", "pipefail", "-c"])
            .arg(format!("exec 2>&1\n{code}"))
            .current_dir(dir)
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(out)
            .process_group(0)
            .default_signals()
            .spawn()
            .unwrap();
        Running { what: code.trim().to_owned(), child, log }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until it prints `ready:` (a script) or anything (another
    /// program); an error with its output if it exits or takes too long.
    fn await_ready(&mut self, script: bool, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let out = self.output();
            if (script && out.contains(": ready:")) || (!script && !out.trim().is_empty()) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("`{}` exited ({status}) before it was ready:\n{out}", self.what));
            }
            if start.elapsed() > limit {
                return Err(format!("`{}` was not ready within {limit:?}:\n{out}", self.what));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A Ctrl-C, as a terminal sends it: SIGINT to the process group.
    /// It must exit 0 within a minute.
    fn interrupt(mut self) -> Result<(), String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(format!(
                "`{}` had exited ({status}) before its Ctrl-C:\n{}",
                self.what,
                self.output()
            ));
        }
        match self.stop() {
            Some(status) if status.success() => Ok(()),
            Some(status) => Err(format!(
                "`{}` exited {status} after Ctrl-C; it should exit 0:\n{}",
                self.what,
                self.output()
            )),
            None => Err(format!("`{}` did not stop within 60 s of Ctrl-C:\n{}", self.what, self.output())),
        }
    }

    /// SIGINT to the process group, then (after a minute) SIGKILL; how it
    /// ended, none if it had to be killed.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let group = self.child.id() as i32;
        unsafe { libc::kill(-group, libc::SIGINT) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
        None
    }
}

impl Drop for Running {
    /// A test that fails half way still stops what it started, the
    /// scripts' nodes and broker (in sessions of their own) with them.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// Whether a script's command starts one of the local setups.
fn starts_a_setup(code: &str) -> bool {
    code.contains("deploy/local/run.sh") || code.contains("deploy/local/cluster.sh")
}

/// The page's directory: a link to each of the repository's entries, with
/// `.local` and `bin/` of its own, and a copy of `examples/` (npm installs
/// into it, and refuses a package reached through a link). Nothing the
/// scripts leave reaches the repository.
fn workspace(dir: &Path) {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let (name, path) = (entry.file_name(), entry.path());
            if path.is_dir() {
                if name != "node_modules" && name != "__pycache__" {
                    copy(&path, &to.join(&name));
                }
            } else {
                std::fs::copy(&path, to.join(&name)).unwrap();
            }
        }
    }
    for entry in std::fs::read_dir(repo()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == ".local" || name == "target" || name == ".git" {
            continue;
        }
        if name == "examples" {
            copy(&entry.path(), &dir.join(&name));
        } else {
            std::os::unix::fs::symlink(entry.path(), dir.join(&name)).unwrap();
        }
    }
    std::fs::create_dir(dir.join("bin")).unwrap();
}

/// A temporary directory holding a page's directory, `hourglass/`.
fn page_dir() -> (PageDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hourglass");
    std::fs::create_dir(&dir).unwrap();
    workspace(&dir);
    (PageDir { tmp, dir: dir.clone() }, dir)
}

/// Runs a page's blocks; returns what went wrong, every block's.
fn run_page(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(name)).unwrap();
    let page = parse_page(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (tmp, dir) = page_dir();
    let env = page_env(&dir);
    let mut failures = Vec::new();
    let mut background: Vec<Running> = Vec::new();
    let mut setup: Option<Running> = None;
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let start_setup = |code: &str, n: usize| {
        let mut running = Running::start(&dir, &env, code, logs.join(format!("setup-{n}.log")));
        let limit = if code.contains("cluster.sh") { 180 } else { 120 };
        running.await_ready(true, Duration::from_secs(limit)).map(|()| running)
    };
    match page.setup {
        Setup::None => {}
        Setup::RunSh | Setup::ClusterSh => {
            let script = if page.setup == Setup::RunSh { "run.sh" } else { "cluster.sh" };
            match start_setup(&format!("bash deploy/local/{script}"), 0) {
                Ok(running) => setup = Some(running),
                Err(e) => return vec![format!("{name}: starting {script}: {e}")],
            }
        }
    }
    for block in &page.blocks {
        let at = format!("{name}:{}", block.line);
        match block.kind {
            Kind::Skip => continue,
            Kind::Background => {
                if starts_a_setup(&block.code) {
                    if let Some(previous) = setup.take()
                        && let Err(e) = previous.interrupt()
                    {
                        failures.push(format!("{at}: stopping the setup before this one: {e}"));
                    }
                    match start_setup(&block.code, block.line) {
                        Ok(running) => setup = Some(running),
                        Err(e) => {
                            failures.push(format!("{at}: {e}"));
                            break;
                        }
                    }
                } else {
                    let log = logs.join(format!("background-{}.log", block.line));
                    let mut running = Running::start(&dir, &env, &block.code, log);
                    match running.await_ready(false, Duration::from_secs(60)) {
                        Ok(()) => background.push(running),
                        Err(e) => failures.push(format!("{at}: {e}")),
                    }
                }
            }
            Kind::Run(expected) => {
                let log = logs.join(format!("block-{}.log", block.line));
                let mut running = Running::start(&dir, &env, &block.code, log);
                let start = Instant::now();
                let status = loop {
                    if let Ok(Some(status)) = running.child.try_wait() {
                        break Some(status);
                    }
                    if start.elapsed() > Duration::from_secs(180) {
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                let out = running.output();
                let Some(status) = status else {
                    failures.push(format!("{at}: still running after 180 s:\n{}\n{out}", block.code));
                    continue;
                };
                if status.code() != Some(expected) {
                    failures.push(format!(
                        "{at}: exited {status}, the page expects {expected}:\n{}--- it printed:\n{out}",
                        block.code
                    ));
                } else if let Some(shown) = &block.output
                    && !matches_output(shown, &out)
                {
                    failures.push(format!(
                        "{at}: printed what the page does not show:\n{}--- the page shows:\n{shown}--- it printed:\n{out}",
                        block.code
                    ));
                }
            }
        }
    }
    for running in background.into_iter().rev() {
        if let Err(e) = running.interrupt() {
            failures.push(format!("{name}: {e}"));
        }
    }
    if let Some(running) = setup.take() {
        if let Err(e) = running.interrupt() {
            failures.push(format!("{name}: {e}"));
        }
        // Ctrl-C stopped the broker the script started, and every node.
        for port in [9092, 50051, 50052, 50053] {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                failures.push(format!("{name}: something still listens on port {port} after Ctrl-C"));
            }
        }
    }
    failures
}

fn check_page(name: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let failures = run_page(name);
    assert!(
        failures.is_empty(),
        "{} of {name}'s blocks failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn the_readme_runs_as_written() {
    check_page("README.md");
}

#[test]
fn the_api_page_runs_as_written() {
    check_page("docs/API.md");
}

#[test]
fn the_configuration_page_runs_as_written() {
    check_page("docs/CONFIGURATION.md");
}

#[test]
fn the_operations_page_runs_as_written() {
    check_page("docs/OPERATIONS.md");
}

#[test]
fn the_architecture_page_runs_as_written() {
    check_page("docs/ARCHITECTURE.md");
}

#[test]
fn the_cluster_page_runs_as_written() {
    check_page("docs/CLUSTER.md");
}

#[test]
fn the_reliability_page_runs_as_written() {
    check_page("docs/RELIABILITY.md");
}

#[test]
fn the_benchmarks_page_runs_as_written() {
    check_page("docs/BENCHMARKS.md");
}

/// A page's directory and the environment its blocks run in.
fn page_env(dir: &Path) -> Vec<(String, String)> {
    let path = format!("{}:{}", dir.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    vec![
        ("PATH".into(), path),
        ("HOURGLASS_BIN".into(), env!("CARGO_BIN_EXE_hourglass").into()),
        ("HOURGLASS_LOCAL_BIN".into(), dir.join("bin").display().to_string()),
        // Plain output, as in a pipe: the docs show no colours.
        ("NO_COLOR".into(), "1".into()),
        // What every process started for the page carries: see `PageDir`.
        (PAGE_MARK.into(), dir.display().to_string()),
    ]
}

/// The environment variable that names, in every process started for a
/// page, the page's directory.
const PAGE_MARK: &str = "HOURGLASS_DOCS_PAGE";

/// The processes still running that were started for the page in `dir`:
/// the scripts, and the nodes and broker they start in sessions of their
/// own, found by [`PAGE_MARK`] in their environment.
fn left_running(dir: &Path) -> Vec<(i32, String)> {
    let mark = format!("{PAGE_MARK}={}", dir.display());
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut left = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if pid != std::process::id() as i32 && environ.split(|b| *b == 0).any(|v| v == mark.as_bytes()) {
            let command = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let command = String::from_utf8_lossy(&command).replace('\0', " ");
            left.push((pid, command.trim().to_owned()));
        }
    }
    left
}

/// A page's directory, in a temporary one that goes with it. Dropped, it
/// kills whatever started for the page is still running, so that a test
/// that fails half way (or a script that did not stop what it started)
/// never leaves a broker or a node on the ports the next page needs.
struct PageDir {
    tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl PageDir {
    fn path(&self) -> &Path {
        self.tmp.path()
    }
}

impl Drop for PageDir {
    fn drop(&mut self) {
        // Again until none is left: one may fork while the others go.
        for _ in 0..50 {
            let left = left_running(&self.dir);
            if left.is_empty() {
                return;
            }
            for (pid, _) in left {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Starts a test's children with the signals a script handles at their
/// defaults, whatever this process inherited: a suite started as a
/// background job of a script (`cmd &`, nohup, a CI wrapper) runs with
/// SIGINT ignored, a shell cannot trap a signal it was started with
/// ignored, and a Ctrl-C to run.sh would do nothing.
trait DefaultSignals {
    fn default_signals(&mut self) -> &mut Self;
}

impl DefaultSignals for Command {
    fn default_signals(&mut self) -> &mut Command {
        // SAFETY: between fork and exec only `signal`, which is
        // async-signal-safe, runs.
        unsafe {
            self.pre_exec(|| {
                for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                    if libc::signal(signal, libc::SIG_DFL) == libc::SIG_ERR {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            })
        }
    }
}

/// Runs `code` in `dir` to its end; its exit code and output.
fn run_to_end(dir: &Path, code: &str) -> (Option<i32>, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("exec 2>&1\n{code}"))
        .current_dir(dir)
        .envs(page_env(dir))
        .stdin(Stdio::null())
        .default_signals()
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until `running` has printed `text`; false after `limit`.
fn await_text(running: &Running, text: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if running.output().contains(text) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A page's directory (in a temporary one that goes with it) with
/// `script` started there and ready.
fn ready(script: &str, limit: Duration) -> (PageDir, PathBuf, Running) {
    let (tmp, dir) = page_dir();
    let mut running = Running::start(&dir, &page_env(&dir), script, tmp.path().join("script.log"));
    running.await_ready(true, limit).unwrap();
    (tmp, dir, running)
}

/// cluster.sh: a node killed is reported with its signal while the others
/// go on; `restart N` brings it back; a second cluster.sh is refused while
/// one runs; Ctrl-C stops the nodes and the broker and exits 0.
#[test]
fn the_cluster_script_reports_a_dead_node_and_restarts_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_tmp, dir, cluster) = ready("bash deploy/local/cluster.sh", Duration::from_secs(180));

    let (code, out) = run_to_end(&dir, "bash deploy/local/cluster.sh");
    assert_eq!(code, Some(1), "a second cluster is refused: {out}");
    assert!(out.contains("already running"), "{out}");

    let (code, out) = run_to_end(&dir, "kill -9 $(cat .local/node-2.pid)");
    assert_eq!(code, Some(0), "{out}");
    assert!(
        await_text(&cluster, "NODE 2 (pid", Duration::from_secs(20)),
        "the script says node 2 died:\n{}",
        cluster.output()
    );
    assert!(cluster.output().contains("was killed by signal 9"), "{}", cluster.output());
    assert!(!cluster.output().contains("Killed"), "no shell job notice: {}", cluster.output());

    let (code, out) = run_to_end(&dir, "bash deploy/local/cluster.sh restart 2");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("node 2 serves again"), "{out}");
    let (code, out) = run_to_end(&dir, "bash deploy/local/cluster.sh restart 2");
    assert_eq!(code, Some(1), "a running node is not started twice: {out}");

    cluster.interrupt().unwrap();
    for port in [9092, 50051, 50052, 50053] {
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "port {port} still open");
    }
    assert_eq!(left_running(&dir), [], "the script stops everything it started");
}

/// run.sh: hourglass dying is the script's end, with hourglass's status,
/// and the broker it started goes with it.
#[test]
fn the_run_script_ends_when_hourglass_dies() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_tmp, dir, mut run) = ready("bash deploy/local/run.sh", Duration::from_secs(120));
    let (code, out) = run_to_end(&dir, "kill -9 $(cat .local/hourglass.pid)");
    assert_eq!(code, Some(0), "{out}");
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(status)) = run.child.try_wait() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "run.sh goes on:\n{}", run.output());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "{}", run.output());
    assert!(run.output().contains("hourglass exited with status 137"), "{}", run.output());
    assert!(std::net::TcpStream::connect(("127.0.0.1", 9092)).is_err(), "the broker is stopped");
    assert_eq!(left_running(&dir), [], "the broker went with it");
}

/// run.sh: a Ctrl-C stops hourglass and the broker (each in a session of
/// its own), and the script exits 0, leaving nothing running.
#[test]
fn a_ctrl_c_stops_run_sh_and_everything_it_started() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_page, dir, run) = ready("bash deploy/local/run.sh", Duration::from_secs(120));
    assert!(left_running(&dir).len() >= 3, "the script, hourglass and the broker: {:?}", left_running(&dir));
    run.interrupt().unwrap();
    assert_eq!(left_running(&dir), [], "the script stops everything it started");
    for port in [9092, 50051] {
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "port {port} still open");
    }
}

/// run.sh and cluster.sh stop what they started on SIGTERM (a service
/// manager, `kill`) and SIGHUP (a closed terminal), sent to the script
/// alone, as on Ctrl-C: they exit 0 and leave nothing running.
#[test]
fn the_scripts_stop_everything_on_sigterm_and_sighup() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (script, signal, name) in [
        ("run.sh", libc::SIGTERM, "SIGTERM"),
        ("run.sh", libc::SIGHUP, "SIGHUP"),
        ("cluster.sh", libc::SIGTERM, "SIGTERM"),
    ] {
        let (_page, dir, mut run) = ready(&format!("bash deploy/local/{script}"), Duration::from_secs(180));
        unsafe { libc::kill(run.child.id() as i32, signal) };
        let start = Instant::now();
        let status = loop {
            if let Ok(Some(status)) = run.child.try_wait() {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{script} goes on after {name}:\n{}",
                run.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(status.success(), "{script} after {name}: {status}\n{}", run.output());
        assert_eq!(left_running(&dir), [], "{script} stops everything it started on {name}");
    }
}

/// A suite started as a background job of a script (`cmd &`, nohup, a CI
/// wrapper) runs with SIGINT ignored, and everything it starts inherits
/// that: the Ctrl-C test above still passes when this test binary runs it
/// so started.
#[test]
fn with_sigint_ignored_as_in_a_background_job_the_ctrl_c_test_still_passes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let name = "docs::a_ctrl_c_stops_run_sh_and_everything_it_started";
    let mut run = Command::new(std::env::current_exe().unwrap());
    run.args(["--exact", name, "--test-threads", "1"]).stdin(Stdio::null());
    // SAFETY: between fork and exec only `signal`, which is
    // async-signal-safe, runs.
    unsafe {
        run.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        })
    };
    let out = run.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the test ran: {text}");
}

/// Every page of docs/ is run by a test above, and every relative link of
/// every page names a file that exists.
#[test]
fn every_page_is_run_and_every_link_resolves() {
    let mut pages: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| format!("docs/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|p| p.ends_with(".md"))
        .collect();
    pages.push("README.md".into());
    for page in &pages {
        assert!(PAGES.contains(&page.as_str()), "{page} is not run by a test of tests/it/docs.rs: add one");
    }
    let mut broken = Vec::new();
    for page in pages.iter().map(String::as_str).chain(["CHANGELOG.md"]) {
        let Ok(text) = std::fs::read_to_string(repo().join(page)) else { continue };
        let base = repo().join(page).parent().unwrap().to_owned();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() || file.contains("://") || file.starts_with("mailto:") || file.contains(' ') {
                continue;
            }
            if !base.join(file).exists() {
                broken.push(format!("{page}: {target}"));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

/// The test's own reading of pages: what it runs, and how it compares.
#[test]
fn blocks_and_outputs_are_read_as_the_module_says() {
    let page = parse_page(
        "<!-- docs-test: run.sh -->\n\
         text\n\n```sh\necho hi\n```\n\n```text output\nhi\n```\n\n\
         ```sh exit=3\nexit 3\n```\n\
         ```sh background\nsleep 9\n```\n\
         ```sh skip\nkubectl apply -f x\n```\n\
         ```toml\na = 1\n```\n",
    )
    .unwrap();
    assert_eq!(page.setup, Setup::RunSh);
    let kinds: Vec<_> = page.blocks.iter().map(|b| b.kind.clone()).collect();
    assert_eq!(kinds, [Kind::Run(0), Kind::Run(3), Kind::Background, Kind::Skip]);
    assert_eq!(page.blocks[0].output.as_deref(), Some("hi\n"));
    assert_eq!(page.blocks[0].code, "echo hi\n");
    assert!(parse_page("# no setup\n").is_err());
    assert!(parse_page("<!-- docs-test: none -->\n```json output\n{}\n```\n").is_err(), "output of nothing");
    assert!(parse_page("<!-- docs-test: none -->\n```sh\nx\n```\ntext\n```json output\n{}\n```\n").is_err());
    assert!(parse_page("<!-- docs-test: none -->\n```bash\nx\n```\n").is_err(), "bash is not run");
    assert!(parse_page("<!-- docs-test: none -->\n```shell-session\nx\n```\n").is_err());
    assert!(parse_page("<!-- docs-test: none -->\n~~~sh\nx\n~~~\n").is_err(), "~~~ is not read");
    assert!(parse_page("<!-- docs-test: none -->\n````sh\nx\n````\n").is_err());
    assert!(
        parse_page("<!-- docs-test: none -->\n```sh skip\nx\n```\n```text output\ny\n```\n").is_err(),
        "the output of a block that is not run is never compared"
    );

    assert!(matches_output("a\nb\n", "a\nb  \n\n"));
    assert!(!matches_output("a\nb\n", "a\nc\n"));
    assert!(!matches_output("a\n", "a\nb\n"), "every line is shown");
    assert!(matches_output("\"id\": \"[..]\",\n", "\"id\": \"01JD\",\n"));
    assert!(matches_output("x [..] y [..] z", "x 1 y 2 z"));
    assert!(!matches_output("x [..] y", "x 1 z"));
    assert!(matches_output("first\n...\nlast\n", "first\n1\n2\nlast\n"));
    assert!(matches_output("first\n...\nlast\n", "first\nlast\n"));
    assert!(!matches_output("first\n...\nlast\n", "first\nlast\nmore\n"));
}
