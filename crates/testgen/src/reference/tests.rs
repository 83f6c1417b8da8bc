use super::*;
use allocsim_sim::SimDevice;

struct Rig {
    model: Reference,
    device: SimDevice,
    events: Vec<Event>,
}

impl Rig {
    fn new(conf: &str, total: u64) -> Rig {
        Rig {
            model: Reference::new(conf).unwrap(),
            device: SimDevice::for_tests(total),
            events: Vec::new(),
        }
    }
    fn alloc(&mut self, id: u64, size: u64) -> Result<Granted, OomInfo> {
        let mut env = Env::new(&mut self.device, &mut self.events);
        self.model.malloc(&mut env, AllocId(id), size, StreamId(0))
    }
    fn free(&mut self, id: u64) {
        let mut env = Env::new(&mut self.device, &mut self.events);
        self.model.free(&mut env, AllocId(id));
    }
    fn actions(&mut self) -> Vec<&'static str> {
        self.events.drain(..).map(|e| e.action()).collect()
    }
    fn check(&self) {
        let problems =
            crate::oracles::stat_consistency(&self.model.snapshot(), &self.model.stats(), true);
        assert!(problems.is_empty(), "{problems:?}");
    }
}

#[test]
fn rounding_follows_pytorchs_examples() {
    let four = Settings::default().apply("roundup_power2_divisions:4").unwrap();
    assert_eq!(round_size(&four, 1200), 1536, "below 512 * divisions plain rounding applies");
    assert_eq!(round_size(&four, 5000), 5120);
    assert_eq!(round_size(&Settings::default(), 1), 512);
    assert_eq!(round_size(&Settings::default(), 513), 1024);
    let list = Settings::default()
        .apply("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
        .unwrap();
    assert_eq!(round_size(&list, 84 * MIB), 88 * MIB);
    assert_eq!(round_size(&list, 400 * MIB), 512 * MIB);
    assert_eq!(round_size(&four, 4 * 21 * MIB), 96 * MIB);
    assert_eq!(allocation_size(MIB), 2 * MIB);
    assert_eq!(allocation_size(MIB + 512), 20 * MIB);
    assert_eq!(allocation_size(19 * MIB), 20 * MIB);
}

#[test]
fn small_blocks_split_and_merge_back() {
    let mut r = Rig::new("", 1 << 30);
    let a = r.alloc(0, 1).unwrap();
    assert_eq!(a.size, 512);
    assert_eq!(r.actions(), ["segment_alloc", "alloc"]);
    let b = r.alloc(1, 1000).unwrap();
    assert_eq!(b.addr, a.addr + 512, "best fit takes the low part of the remainder");
    assert_eq!(r.model.stats().inactive_split.small_pool.current, 1);
    r.check();
    r.free(0);
    r.free(1);
    assert_eq!(
        r.actions(),
        ["alloc", "free_requested", "free_completed", "free_requested", "free_completed"]
    );
    let s = r.model.stats();
    assert_eq!((s.inactive_split.all.current, s.inactive_split_bytes.all.current), (0, 0));
    r.check();
    let snap = r.model.snapshot();
    assert_eq!(snap[0].blocks.len(), 1, "merged into one free block");
    assert_eq!(snap[0].blocks[0].requested_size, 1000, "the freed block object survives the merge");
}

#[test]
fn a_large_block_splits_only_past_one_mib() {
    let mut r = Rig::new("", 1 << 30);
    let a = r.alloc(0, 19 * MIB).unwrap();
    assert_eq!(a.size, 20 * MIB, "a 19 MiB request takes the whole 20 MiB segment");
    let b = r.alloc(1, 5 * MIB).unwrap();
    assert_eq!(b.size, 5 * MIB);
    assert_eq!(r.model.stats().inactive_split_bytes.large_pool.current as u64, 15 * MIB);
    r.check();
}

#[test]
fn oversize_blocks_serve_only_large_requests() {
    let mut r = Rig::new("max_split_size_mb:40", 1 << 30);
    r.alloc(0, 100 * MIB).unwrap();
    r.free(0);
    r.actions();
    r.alloc(1, 30 * MIB).unwrap();
    assert_eq!(
        r.actions(),
        ["segment_alloc", "alloc"],
        "a normal request never gets an oversize block"
    );
    r.alloc(2, 90 * MIB).unwrap();
    assert_eq!(r.actions(), ["alloc"], "within max_non_split_rounding of the cached block");
    assert_eq!(r.model.stats().oversize_allocations.current, 1);
    r.check();
}

#[test]
fn oom_after_emptying_the_cache() {
    let mut r = Rig::new("", 64 * MIB);
    r.alloc(0, 30 * MIB).unwrap();
    r.free(0);
    r.alloc(1, 40 * MIB).unwrap();
    assert_eq!(
        r.actions(),
        [
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "segment_free",
            "segment_alloc",
            "alloc"
        ]
    );
    assert_eq!(r.model.stats().num_alloc_retries, 1);
    let info = r.alloc(2, 40 * MIB).unwrap_err();
    assert_eq!(info.rounded_bytes, 40 * MIB);
    assert_eq!(r.actions(), ["oom"]);
    assert_eq!(r.model.stats().num_ooms, 1);
    r.check();
}
