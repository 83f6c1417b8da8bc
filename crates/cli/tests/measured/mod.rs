//! A child `allocsim` measured: its peak resident memory and CPU time, from `wait4`. Shared by
//! the tests that hold commands to memory and time bounds (`hostile.rs`, `scale.rs`).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub const GB: u64 = 1_000_000_000;

/// A fresh directory for `test`'s files.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allocsim-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Issue 50's OOM storm, as `dir/ooms.csv`: an RMM log of 100k live 512 KiB blocks, then
/// 100k requests of 1 TiB that all fail.
pub fn oom_storm_log(dir: &std::path::Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("ooms.csv");
    let mut log = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(log, "Thread,Time,Action,Pointer,Size,Stream").unwrap();
    for i in 0..100_000u64 {
        writeln!(log, "1,0,allocate,0x{:x},524288,0", 0x7f00_0000_0000 + (i << 20)).unwrap();
    }
    for i in 0..100_000u64 {
        writeln!(log, "1,0,allocate,0x{:x},1099511627776,0", 65536 + i).unwrap();
    }
    log.flush().unwrap();
    path
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub peak_bytes: u64,
    pub cpu_seconds: f64,
}

/// `allocsim ARGS` in a child, with its peak resident memory and CPU time (`wait4`, the one
/// call that gives one child's own rusage; std has no safe form of it). A child still running
/// after two minutes is killed.
#[allow(unsafe_code)]
// The child is reaped by `wait4`, which std's `Child::wait` would otherwise do.
#[allow(clippy::zombie_processes)]
pub fn measured(args: &[&str]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running allocsim");
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).map(|_| text)
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let started = std::time::Instant::now();
    let mut status = 0;
    // SAFETY: all-zero bytes are a valid `rusage` (a struct of integers).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our unreaped child; `status` and `usage` are valid for writes.
        let waited = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(waited >= 0, "wait4: {}", std::io::Error::last_os_error());
        if waited == pid {
            break;
        }
        if started.elapsed() > std::time::Duration::from_secs(120) {
            // Not yet reaped, so the pid is still this child's.
            let _ = child.kill();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run {
        code: if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 },
        stdout: stdout.join().unwrap().unwrap(),
        stderr: stderr.join().unwrap().unwrap(),
        // Linux reports kilobytes.
        peak_bytes: usage.ru_maxrss as u64 * 1024,
        cpu_seconds: seconds(usage.ru_utime) + seconds(usage.ru_stime),
    }
}
