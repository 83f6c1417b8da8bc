//! Every policy's event log on every bundled trace, under its defaults and each of its test
//! settings, held to the SHA-256 digests recorded in `event_logs.txt`: a change to a policy
//! that alters one choice it makes, on any trace, fails here, naming the run and the command
//! that writes its log. A refactoring keeps every line; a change meant to alter a policy's
//! choices records them again, and the diff of `event_logs.txt` shows which runs it altered:
//!
//! `ALLOCSIM_RECORD_EVENT_LOGS=1 cargo test --release -p allocsim-tests event_logs`

use allocsim_replay::{EventLog, Observer};
use allocsim_run::{run_trace, RunOptions};
use allocsim_tests::{bundled_traces, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One run: the trace (its folder and name, as under `traces/`) and the policy spec.
type Run = (String, String);

fn expected_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("event_logs.txt")
}

fn trace_key(path: &Path) -> String {
    let dir = path.parent().and_then(Path::file_name).unwrap().to_string_lossy();
    let name = path.file_name().unwrap().to_string_lossy().replace(".pickle.gz", "");
    format!("{dir}/{name}")
}

/// Every run's log as `BYTES SHA256`, by trace and spec.
fn digests() -> BTreeMap<Run, String> {
    let mut digests = BTreeMap::new();
    for path in bundled_traces() {
        let trace = allocsim_trace::read_trace(&path).unwrap_or_else(|e| panic!("{e}"));
        for policy in allocsim_policies::POLICIES {
            let confs = std::iter::once(None).chain(policy.test_settings.iter().map(|s| Some(*s)));
            for conf in confs {
                let opts = RunOptions {
                    policy: policy.name.into(),
                    alloc_conf: conf.map(str::to_string),
                    ..RunOptions::default()
                };
                let mut log = EventLog::new(Sha256::default());
                let mut observers: [&mut dyn Observer; 1] = [&mut log];
                run_trace(&trace, &opts, &mut observers, |_| {}).unwrap();
                let sha = log.finish().unwrap();
                let spec =
                    conf.map_or(policy.name.to_string(), |c| format!("{}[{c}]", policy.name));
                digests.insert((trace_key(&path), spec), format!("{} {}", sha.bytes(), sha.hex()));
            }
        }
    }
    digests
}

fn reproduce(run: &Run) -> String {
    let (name, conf) = allocsim_policies::parse_spec(&run.1);
    let conf = conf.map_or(String::new(), |c| format!(" --alloc-conf '{c}'"));
    format!(
        "allocsim replay traces/{}.pickle.gz --policy {name}{conf} --event-log log.txt && \
         wc -c log.txt && sha256sum log.txt",
        run.0
    )
}

#[test]
fn event_logs_stay_as_recorded() {
    let now = digests();
    let text = |d: &BTreeMap<Run, String>| -> String {
        d.iter().map(|((trace, spec), digest)| format!("{trace} {spec} {digest}\n")).collect()
    };
    if std::env::var_os("ALLOCSIM_RECORD_EVENT_LOGS").is_some() {
        std::fs::write(expected_path(), text(&now)).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(expected_path()).unwrap();
    let mut expected = BTreeMap::new();
    for line in recorded.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [trace, spec, bytes, sha] = fields[..] else { panic!("event_logs.txt: {line:?}") };
        expected.insert((trace.to_string(), spec.to_string()), format!("{bytes} {sha}"));
    }
    let mut failures = Vec::new();
    for (run, digest) in &now {
        match expected.get(run) {
            Some(e) if e == digest => {}
            Some(e) => failures.push(format!(
                "{} {}: log (bytes sha256) {digest}, recorded {e}\n  reproduce: {}",
                run.0,
                run.1,
                reproduce(run)
            )),
            None => failures.push(format!("{} {}: not recorded", run.0, run.1)),
        }
    }
    for run in expected.keys().filter(|run| !now.contains_key(*run)) {
        failures.push(format!("{} {}: recorded, but no longer run", run.0, run.1));
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs differ from tests/event_logs.txt:\n{}",
        failures.len(),
        now.len(),
        failures.join("\n")
    );
}

#[test]
fn sha256_matches_the_standard_vectors() {
    let digest = |input: &[u8]| {
        let mut sha = Sha256::default();
        std::io::Write::write_all(&mut sha, input).unwrap();
        sha.hex()
    };
    assert_eq!(digest(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(digest(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    let two_blocks = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    assert_eq!(
        digest(two_blocks),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
    assert_eq!(
        digest(&[b'a'; 1_000_000]),
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    );
}
