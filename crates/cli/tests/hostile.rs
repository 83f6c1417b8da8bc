//! Hostile inputs: small files that ask for gigabytes of memory or billions of steps, each
//! made here at test time, given to `allocsim info` in a child process whose peak memory and
//! CPU time are measured with `wait4`. Each must end in a clear error naming the file, under
//! 1 GB of memory and 10 s of CPU (the bounds of the issue that listed them; they run in well
//! under a second each, so the time bound catches a reader that spins, not a slow machine).
//! A legitimate file of the same size class, a 15-million-entry snapshot, must read.
//!
//! Files are written as they are compressed, so this process stays small: a child's peak
//! as `wait4` reports it includes what its parent held when it was started.

use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;
use std::path::{Path, PathBuf};

mod measured;

use measured::{measured, oom_storm_log, scratch, GB};

/// One gzip member of `head`, then `body` repeated `times`, then `tail`.
fn gzip_member(head: &[u8], body: &[u8], times: u64, tail: &[u8]) -> Vec<u8> {
    let mut z = GzEncoder::new(Vec::new(), Compression::fast());
    z.write_all(head).unwrap();
    for _ in 0..times {
        z.write_all(body).unwrap();
    }
    z.write_all(tail).unwrap();
    z.finish().unwrap()
}

/// A gzip file written as it is compressed.
fn gzip_file(dir: &Path, name: &str) -> (PathBuf, GzEncoder<std::io::BufWriter<std::fs::File>>) {
    let path = dir.join(name);
    let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    (path, GzEncoder::new(file, Compression::fast()))
}

/// `body` (a pattern that divides 1 MiB) repeated to `bytes` bytes.
fn repeated(pattern: &[u8], bytes: u64) -> (Vec<u8>, u64) {
    let chunk: Vec<u8> = pattern.iter().copied().cycle().take(1 << 20).collect();
    assert_eq!(chunk.len() % pattern.len(), 0);
    (chunk, bytes >> 20)
}

fn write(dir: &Path, name: &str, members: &[Vec<u8>]) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    for m in members {
        f.write_all(m).unwrap();
    }
    path
}

/// `allocsim info FILE` fails cleanly, saying `message`, within the bounds.
fn refused(path: &Path, message: &str) {
    let run = measured(&["info", path.to_str().unwrap()]);
    let name = path.file_name().unwrap().to_string_lossy();
    println!(
        "{name}: exit {}, {:.2} s CPU, {} MB peak: {}",
        run.code,
        run.cpu_seconds,
        run.peak_bytes / 1_000_000,
        run.stderr.trim()
    );
    assert_eq!(run.code, 1, "{name}: {}", run.stderr);
    assert!(run.stderr.contains(&*name) && run.stderr.contains(message), "{name}: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(run.peak_bytes < GB, "{name}: {} bytes at the peak", run.peak_bytes);
    assert!(run.cpu_seconds < 10.0, "{name}: {} s of CPU", run.cpu_seconds);
}

const HELD: &str = "reading it would hold more than";
const PROTO4: &[u8] = b"\x80\x04";

#[test]
fn hostile_pickles_end_in_a_clear_error_within_bounds() {
    let dir = scratch("hostile");
    // 2^30 MARKs: marks were never charged (8.2 GB).
    let (chunk, n) = repeated(b"(", 1 << 30);
    let m = write(&dir, "marks.pickle.gz", &[gzip_member(PROTO4, &chunk, n, b"}.")]);
    refused(&m, HELD);

    // A 7 GiB BINBYTES8 of zeros, as 7 gzip members of 1 GiB: a scratch buffer and a copy
    // (over 14 GB).
    let (chunk, n) = repeated(&[0], 1 << 30);
    let zeros = gzip_member(b"", &chunk, n, b"");
    let mut members = vec![gzip_member(b"\x80\x04\x8e", &(7u64 << 30).to_le_bytes(), 1, b"")];
    members.extend(std::iter::repeat_n(zeros, 7));
    members.push(gzip_member(b".", b"", 0, b""));
    refused(&write(&dir, "bytes8.pickle.gz", &members), HELD);

    // 170 M NONEs appended to a list (6.5 GB); 200 M on the stack (4.1 GB).
    let (chunk, n) = repeated(b"N", 170 << 20);
    refused(&write(&dir, "list.pickle.gz", &[gzip_member(b"\x80\x04](", &chunk, n, b"e.")]), HELD);
    let (chunk, n) = repeated(b"N", 200 << 20);
    refused(&write(&dir, "stack.pickle.gz", &[gzip_member(PROTO4, &chunk, n, b".")]), HELD);

    // 150 M MEMOIZEs (2.7 GB).
    let (chunk, n) = repeated(b"\x94", 150 << 20);
    refused(&write(&dir, "memo.pickle.gz", &[gzip_member(b"\x80\x04N", &chunk, n, b".")]), HELD);

    // 150 M LONG_BINPUTs to sparse keys (12.7 GB, 288 s).
    let (sparse, mut z) = gzip_file(&dir, "sparse.pickle.gz");
    z.write_all(b"\x80\x04N").unwrap();
    let mut buf = Vec::with_capacity(5 << 16);
    for block in 0..(150_000_000u32 >> 16) + 1 {
        buf.clear();
        for i in 0..1u32 << 16 {
            buf.push(b'r');
            buf.extend((((block << 16) + i).wrapping_mul(7) | 1 << 31).to_le_bytes());
        }
        z.write_all(&buf).unwrap();
    }
    z.write_all(b".").unwrap();
    z.finish().unwrap().flush().unwrap();
    refused(&sparse, HELD);

    // MARK POP_MARK 2^29 times, in 10 gzip members (10 MB, 346 s): work that builds nothing.
    let (chunk, n) = repeated(b"(1", 1 << 30);
    let mark_pop = gzip_member(b"", &chunk, n, b"");
    let mut members = vec![gzip_member(PROTO4, b"", 0, b"")];
    members.extend(std::iter::repeat_n(mark_pop, 10));
    members.push(gzip_member(b"}.", b"", 0, b""));
    refused(&write(&dir, "idle.pickle.gz", &members), "opcodes that build nothing");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An RMM log with 100k live allocations, then 100k requests of 1 TiB that all fail: each
/// zoo policy replays it within the bounds (every OOM used to walk every live block). And a
/// log whose one line is 300 MB long is refused at that line.
#[test]
fn rmm_logs_that_pile_up_ooms_or_never_end_a_line_stay_within_bounds() {
    let dir = scratch("rmm");
    let path = oom_storm_log(&dir);
    let file = path.to_str().unwrap();
    for policy in allocsim_policies::names() {
        let run = measured(&["replay", "--device", "sim", "--policy", policy, file]);
        println!(
            "{policy}: exit {}, {:.2} s CPU, {} MB peak",
            run.code,
            run.cpu_seconds,
            run.peak_bytes / 1_000_000
        );
        assert_eq!(run.code, 0, "{policy}: {}", run.stderr);
        // At least the 100k requests of 1 TiB fail (a policy that rounds up may not fit
        // all the first 100k either).
        let ooms = run.stdout.lines().find_map(|l| l.trim().strip_prefix("OOMs: "));
        let ooms: u64 = ooms.and_then(|n| n.split_whitespace().next()?.parse().ok()).unwrap_or(0);
        assert!(ooms >= 100_000, "{policy}: {}", run.stdout);
        assert!(run.peak_bytes < GB, "{policy}: {} bytes at the peak", run.peak_bytes);
        assert!(run.cpu_seconds < 10.0, "{policy}: {} s of CPU", run.cpu_seconds);
    }

    let long = dir.join("long.csv");
    let mut log = std::io::BufWriter::new(std::fs::File::create(&long).unwrap());
    write!(log, "Thread,Time,Action,Pointer,Size,Stream\n1,0,").unwrap();
    for _ in 0..300 {
        log.write_all(&[b'a'; 1 << 20]).unwrap();
    }
    writeln!(log, ",0x1,1,0").unwrap();
    drop(log);
    let run = measured(&["info", long.to_str().unwrap()]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("long.csv: line 2") && run.stderr.contains("longer than"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.len() < 1000, "the error quotes the line: {} bytes", run.stderr.len());
    assert!(run.peak_bytes < GB && run.cpu_seconds < 10.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot of 15 M entries, flat as PyTorch writes them (keys memoized once, then GETs;
/// APPENDS batches of 1000), reads back: the reader holds a few bytes per entry, not the
/// 8 GiB its old estimate refused at about 12 M.
#[test]
fn a_snapshot_of_15_million_entries_reads() {
    const ENTRIES: u64 = 15_000_000;
    let dir = scratch("15m");
    let (path, mut z) = gzip_file(&dir, "big.pickle.gz");
    let short = |s: &str| [&[0x8c, s.len() as u8][..], s.as_bytes(), b"\x94"].concat();
    let mut head = b"\x80\x04}\x94(".to_vec();
    head.extend(short("segments"));
    head.extend(b"]\x94");
    head.extend(short("device_traces"));
    head.extend(b"]\x94]\x94");
    // Memo: 0 root, 1 "segments", 2 [], 3 "device_traces", 4 the outer list, 5 the entries,
    // 6 the first entry; then its keys and strings: 7 "action", 8 "alloc", 9 "addr",
    // 10 "size", 11 "stream", 12 "time_us", 13 "frames", 14 its (empty) frames. Every entry
    // allocates 512 bytes at an address of its own, so all stay live.
    let addr = |i: u64| (0x7f00_0000_0000u64 + i * 512).to_le_bytes();
    let mut first = b"(}\x94(".to_vec();
    for (key, value) in [
        ("action", short("alloc")),
        ("addr", [&b"\x8a\x06"[..], &addr(0)[..6]].concat()),
        ("size", b"M\x00\x02".to_vec()),
        ("stream", b"K\x00".to_vec()),
        ("time_us", b"K\x00".to_vec()),
        ("frames", b"]\x94".to_vec()),
    ] {
        first.extend(short(key));
        first.extend(value);
    }
    first.push(b'u');
    z.write_all(&head).unwrap();
    z.write_all(&first).unwrap();
    let mut batch = Vec::new();
    for i in 1..ENTRIES {
        batch.extend(b"}(h\x07h\x08h\x09\x8a\x06");
        batch.extend(&addr(i)[..6]);
        batch.extend(b"h\x0aM\x00\x02h\x0bK\x00h\x0cJ");
        batch.extend((i as u32).to_le_bytes());
        batch.extend(b"h\x0dh\x0eu");
        if i % 1000 == 0 {
            batch.extend(b"e(");
            z.write_all(&batch).unwrap();
            batch.clear();
        }
    }
    // The last APPENDS; the entries into the outer list; the root's pairs; STOP.
    batch.extend(b"eau.");
    z.write_all(&batch).unwrap();
    z.finish().unwrap().flush().unwrap();
    let run = measured(&["info", path.to_str().unwrap()]);
    println!(
        "big.pickle.gz: exit {}, {:.2} s CPU, {} MB peak",
        run.code,
        run.cpu_seconds,
        run.peak_bytes / 1_000_000
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let allocs = ENTRIES.to_string();
    let counted = run.stdout.lines().any(|l| l.split_whitespace().eq(["alloc", &allocs]));
    assert!(counted, "{}", run.stdout);
    std::fs::remove_dir_all(&dir).unwrap();
}
