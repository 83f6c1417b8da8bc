//! PyTorch's own allocator tests with concrete numbers (docs/pytorch-caching-allocator.md §12), ported to the clone.
//! Each test names the PyTorch test it follows.

mod pytorch_support;

use allocsim_core::{BlockState, Event, MIB};
use pytorch_support::{stat_consistency_errors, Harness, Rng};

const GIB80: u64 = 80 << 30;

fn assert_consistent(h: &Harness) {
    let errors = stat_consistency_errors(&h.stats(), &h.snapshot());
    assert!(errors.is_empty(), "{errors:#?}");
}

/// test_allocator_settings: `active_bytes.all.allocated` deltas under changing settings.
#[test]
fn allocator_settings_deltas() {
    let mut h = Harness::new("", GIB80);
    let key = "active_bytes.all.allocated";
    let nbytes = 4 * 21 * MIB;
    let nbytes_big = 4 * 100 * MIB;
    h.settings("").unwrap();
    let start = h.stat(key);
    let _x = h.alloc(nbytes);
    let reg = h.stat(key);
    assert_eq!(reg - start, 88_080_384);

    let start_requested = h.stat("requested_bytes.all.allocated");
    h.settings("roundup_power2_divisions:4").unwrap();
    let _y = h.alloc(nbytes);
    assert_eq!(h.stat(key) - reg, 100_663_296);
    assert_eq!(h.stat("requested_bytes.all.allocated") - start_requested, 88_080_384);

    h.settings("garbage_collection_threshold:0.5").unwrap();
    h.settings("garbage_collection_threshold:0.5,max_split_size_mb:40").unwrap();
    h.empty_cache();
    let start = h.stat(key);
    let _z = h.alloc(nbytes);
    assert_eq!(h.stat(key) - start, 88_080_384, "divisions were reset");

    h.empty_cache();
    h.settings("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
        .unwrap();
    let start = h.stat(key);
    let _w = h.alloc(nbytes);
    assert_eq!(h.stat(key) - start, 92_274_688);
    h.empty_cache();
    let start = h.stat(key);
    let _v = h.alloc(nbytes_big);
    assert_eq!(h.stat(key) - start, 536_870_912);

    h.empty_cache();
    h.settings("release_lock_on_cudamalloc:True").unwrap();
    let start = h.stat(key);
    let _w2 = h.alloc(nbytes);
    assert_eq!(h.stat(key) - start, 88_080_384);

    for bad in [
        "foo:1,bar:2",
        "garbage_collection_threshold:1.2",
        "max_split_size_mb:2",
        "release_lock_on_cudamalloc:none",
        "pinned_use_cuda_host_register:none",
        "pinned_num_register_threads:none",
        "pinned_num_register_threads:1024",
    ] {
        assert!(h.settings(bad).is_err(), "{bad} must be refused");
    }
    assert_consistent(&h);
}

/// The `max_split_size` stat is captured at construction, not by later settings.
#[test]
fn max_split_size_stat_is_fixed_at_construction() {
    let mut h = Harness::new("max_split_size_mb:32", GIB80);
    assert_eq!(h.stats().max_split_size, 32 * MIB as i64);
    h.settings("max_split_size_mb:64").unwrap();
    assert_eq!(h.stats().max_split_size, 32 * MIB as i64);
    assert_eq!(Harness::new("", GIB80).stats().max_split_size, -1);
}

/// A budget of exactly 120 MiB through a memory fraction of a 1 GiB device.
fn harness_with_120_mib_budget() -> Harness {
    let total = 1 << 30;
    let mut h = Harness::new("", total);
    let fraction = (120 * MIB) as f64 / total as f64;
    assert_eq!((fraction * total as f64) as u64, 120 * MIB);
    h.set_fraction(fraction).unwrap();
    h
}

/// test_max_split_expandable: the 4th 40 MiB block must OOM; after freeing all three, 120 MiB
/// succeeds through the release paths with an expandable block in the free list.
#[test]
fn max_split_expandable() {
    let mut h = harness_with_120_mib_budget();
    h.settings("expandable_segments:False,max_split_size_mb:40").unwrap();
    let a = h.alloc(40 * MIB);
    h.settings("expandable_segments:True,max_split_size_mb:40").unwrap();
    let b = h.alloc(40 * MIB);
    h.settings("expandable_segments:False,max_split_size_mb:40").unwrap();
    let c = h.alloc(40 * MIB);
    assert!(h.malloc(40 * MIB).is_err(), "4th 40 MiB must OOM");
    assert_eq!(h.stats().num_ooms, 1);
    assert_consistent(&h);
    h.free(a);
    h.free(b);
    h.free(c);
    let big = h.malloc(120 * MIB);
    assert!(big.is_ok(), "120 MiB must succeed after the frees");
    assert_eq!(
        h.segment_events(),
        vec![
            ("segment_alloc", 40 * MIB),
            ("segment_map", 40 * MIB),
            ("segment_alloc", 40 * MIB),
            ("oom", 40 * MIB),
            // release_available_cached_blocks frees the two oversize cudaMalloc segments,
            // largest (then highest address) first, skipping the expandable block.
            ("segment_free", 40 * MIB),
            ("segment_free", 40 * MIB),
            // release_cached_blocks unmaps the expandable pages; the retry then succeeds.
            ("segment_unmap", 40 * MIB),
            ("segment_alloc", 120 * MIB),
        ]
    );
    assert_eq!(h.stats().num_alloc_retries, 2);
    assert_consistent(&h);
}

/// test_garbage_collect_expandable: GC runs with an expandable block in the free list and the
/// 80 MiB request succeeds by growing the expandable segment.
#[test]
fn garbage_collect_expandable() {
    let mut h = harness_with_120_mib_budget();
    h.settings("expandable_segments:False,garbage_collection_threshold:0.5").unwrap();
    let a = h.alloc(40 * MIB);
    h.settings("expandable_segments:True,garbage_collection_threshold:0.5").unwrap();
    let b = h.alloc(40 * MIB);
    h.free(a);
    h.free(b);
    assert!(h.malloc(80 * MIB).is_ok());
    assert_eq!(
        h.segment_events(),
        vec![
            ("segment_alloc", 40 * MIB),
            ("segment_map", 40 * MIB),
            ("segment_free", 40 * MIB), // GC
            ("segment_map", 40 * MIB),
        ]
    );
    assert_eq!(h.stats().num_alloc_retries, 0);
    assert_consistent(&h);
}

/// test_set_per_process_memory_fraction: 0.499 of the device fits under 0.5, 0.5 does not
/// once anything else is reserved; out-of-range fractions are refused.
#[test]
fn memory_fraction_oom() {
    let total = GIB80;
    let mut h = Harness::new("", total);
    h.set_fraction(0.5).unwrap();
    let _small = h.alloc(1024);
    let reserved = h.stats().reserved_bytes.all.peak as u64;
    let id = h.alloc((total as f64 * 0.499) as u64 - reserved);
    h.free(id);
    h.empty_cache();
    let err = h.malloc((total as f64 * 0.5) as u64).unwrap_err();
    assert_eq!(err.allowed_bytes, Some(total / 2));
    assert!(matches!(h.events.last(), Some(Event::Oom { .. })));
    assert_eq!(h.stats().num_ooms, 1);
    assert!(h.set_fraction(-0.1).is_err());
    assert!(h.set_fraction(2.0).is_err());
    // A fraction of 1.0 lifts the cap (NEWEST semantics).
    h.set_fraction(1.0).unwrap();
    assert!(h.malloc((total as f64 * 0.5) as u64).is_ok());
}

/// test_out_of_memory_retry: with the device partly taken by others, half of it succeeds, a
/// second half OOMs, and after the first is freed the cache serves it again. A slightly bigger
/// request then needs the last-resort retry (free the cached segment, cudaMalloc again).
#[test]
fn out_of_memory_retry() {
    let total = 8 << 30;
    let mut h = Harness::with_free("", total, total / 4 * 3);
    let half = total / 2;
    let a = h.alloc(half);
    let _ = h.malloc(half).unwrap_err();
    h.free(a);
    let b = h.alloc(half);
    let s = h.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries, s.num_sync_all_streams), (1, 1, 1));
    h.free(b);
    let _c = h.alloc(half + 2 * MIB);
    let s = h.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries, s.num_sync_all_streams), (1, 2, 2));
    assert_eq!(
        h.segment_events(),
        vec![
            ("segment_alloc", half),
            ("oom", half),
            ("segment_free", half),
            ("segment_alloc", half + 2 * MIB),
        ]
    );
    assert_consistent(&h);
}

/// test_memory_snapshot: block layout, stale `requested_size`, 1000 x 512 B tiling one segment.
#[test]
fn memory_snapshot_layout() {
    let mut h = Harness::new("", GIB80);
    let tmp = h.alloc(2 * 311 * 411 * 4);
    h.free(tmp);
    let _unused = h.alloc(310 * 410 * 4);
    let (_, x) = h.malloc(311 * 411 * 4).unwrap();
    let mut tensors: Vec<_> = (0..1000).map(|_| h.alloc(128 * 4)).collect();
    let segments_with_tensors = h.stats().segment.all.current;
    assert_eq!(segments_with_tensors, 1, "1000 x 512 B tile the same segment");
    let mut rng = Rng::new(7);
    while !tensors.is_empty() {
        let i = rng.below(tensors.len() as u64) as usize;
        h.free(tensors.swap_remove(i));
    }
    let _last = h.alloc(128 * 5 * 4);
    let snap = h.snapshot();
    assert_eq!(snap.len(), 1);
    let blocks = &snap[0].blocks;
    assert_eq!(blocks.len(), 4);
    assert_eq!((blocks[1].address, blocks[1].requested_size), (x.addr, 311 * 411 * 4));
    assert_eq!(blocks[0].requested_size, 310 * 410 * 4);
    assert_eq!(blocks[2].requested_size, 2560);
    // The surviving free block object last served a 512 B tensor.
    assert_eq!((blocks[3].state, blocks[3].requested_size), (BlockState::Inactive, 512));
    assert_consistent(&h);
    h.empty_cache();
    assert!(h.snapshot().len() == 1, "a split segment is not released");
}

/// A cudaMalloc'ed segment's remainder keeps the stale request of the block object that
/// became the remainder (docs/pytorch-caching-allocator.md §2.1).
#[test]
fn remainder_keeps_stale_requested_size() {
    let mut h = Harness::new("", GIB80);
    let a = h.alloc(1000);
    h.free(a);
    let _b = h.alloc(3000);
    let snap = h.snapshot();
    let blocks = &snap[0].blocks;
    assert_eq!(blocks[0].requested_size, 3000);
    assert_eq!((blocks[1].state, blocks[1].requested_size), (BlockState::Inactive, 1000));
}

/// test_record_stream: a block used on another stream is not reused until that work is done,
/// and is reused (same address) afterwards.
#[test]
fn record_stream_delays_reuse() {
    let mut h = Harness::new("", GIB80);
    let (a, ga) = h.malloc(4096).unwrap();
    h.record_stream(a, 99);
    h.free(a);
    assert!(matches!(h.events.last(), Some(Event::FreeRequested { .. })));
    assert_eq!(h.snapshot()[0].blocks[0].state, BlockState::ActivePendingFree);
    assert_eq!(h.stats().active.all.current, 1);
    assert_eq!(h.stats().allocation.all.current, 0);
    let (_, gb) = h.malloc(4096).unwrap();
    assert_ne!(gb.addr, ga.addr);
    h.free_completed(a);
    assert!(matches!(h.events.last(), Some(Event::FreeCompleted { .. })));
    let (_, gc) = h.malloc(4096).unwrap();
    assert_eq!(gc.addr, ga.addr);
    assert_consistent(&h);
}

/// test_caching_allocator_record_stream_oom: pending frees are completed by the last-resort
/// path, so 100 x 160 MB with record_stream never OOM on a 1 GiB device.
#[test]
fn record_stream_oom_is_rescued_by_sync() {
    let mut h = Harness::new("", 1 << 30);
    let y = h.malloc_on(160_000_000, 7).unwrap().0;
    for _ in 0..100 {
        let x = h.alloc(160_000_000);
        h.record_stream(x, 7);
        h.free(x);
    }
    h.free(y);
    assert_eq!(h.stats().num_ooms, 0);
    assert!(h.stats().num_sync_all_streams > 0);
    assert_consistent(&h);
    h.empty_cache();
    assert_eq!(h.stats().reserved_bytes.all.current, 0);
}

/// test_memory_stats: a 1 KiB tensor moves active_bytes by 1024 and is freed back.
#[test]
fn memory_stats_basics() {
    let mut h = Harness::new("", GIB80);
    let a = h.alloc(1024);
    assert_eq!(h.stats().active_bytes.all.current, 1024);
    assert_eq!(h.stats().active_bytes.all.freed, 0);
    h.free(a);
    h.empty_cache();
    let s = h.stats();
    assert_eq!((s.active_bytes.all.current, s.active_bytes.all.freed), (0, 1024));
    assert_eq!(s.reserved_bytes.all.current, 0);
    assert_eq!(s.num_sync_all_streams, 1);
    // A 1-byte request yields a 512-byte block.
    let (_, g) = h.malloc(1).unwrap();
    assert_eq!(g.size, 512);
}

/// should_split: a 19 MiB request in a 20 MiB segment takes the whole segment.
#[test]
fn large_pool_remainder_of_one_mib_is_not_split() {
    let mut h = Harness::new("", GIB80);
    let a = h.alloc(8 * MIB);
    h.free(a);
    let (_, g) = h.malloc(19 * MIB).unwrap();
    assert_eq!(g.size, 20 * MIB);
    let s = h.stats();
    assert_eq!(s.allocated_bytes.all.current, 20 * MIB as i64);
    assert_eq!(s.requested_bytes.all.current, 19 * MIB as i64);
}

/// Event order on the common paths: segment_alloc before alloc; free_requested then
/// free_completed; the trace sizes are the unrounded request.
#[test]
fn event_order_follows_the_trace() {
    let mut h = Harness::new("", GIB80);
    let a = h.alloc(1000);
    h.free(a);
    let actions: Vec<_> = h.events.iter().map(|e| e.action()).collect();
    assert_eq!(actions, ["segment_alloc", "alloc", "free_requested", "free_completed"]);
    match h.events[1] {
        Event::Alloc { size, requested, .. } => assert_eq!((size, requested), (1024, 1000)),
        ref e => panic!("unexpected {e:?}"),
    }
}

/// max_split_size: an oversize cached block is not handed to a small request, nor to a large
/// one it exceeds by max_non_split_rounding or more.
#[test]
fn oversize_blocks_follow_max_split_rules() {
    let mut h = Harness::new("max_split_size_mb:32", GIB80);
    let a = h.alloc(100 * MIB);
    h.free(a);
    let _b = h.alloc(30 * MIB); // below max_split: must not take the 100 MiB block
    assert_eq!(h.stats().segment.all.current, 2);
    let _c = h.alloc(79 * MIB); // 79 + 20 < 100: refused too
    assert_eq!(h.stats().segment.all.current, 3);
    let _d = h.alloc(81 * MIB); // 100 < 81 + 20: takes it whole
    assert_eq!(h.stats().segment.all.current, 3);
    let s = h.stats();
    assert_eq!(s.oversize_allocations.current, 2);
    assert_eq!(s.oversize_segments.current, 2);
    assert_consistent(&h);
}

/// Zero-byte requests get a null pointer and leave no trace.
#[test]
fn zero_byte_request_is_a_null_pointer() {
    let mut h = Harness::new("", GIB80);
    let (id, g) = h.malloc(0).unwrap();
    assert_eq!((g.addr, g.size), (0, 0));
    h.free(id);
    assert!(h.events.is_empty());
}

/// Expandable segments: growth maps pages at the end, empty_cache unmaps whole free pages
/// only, and the snapshot shows each mapped range as a segment.
#[test]
fn expandable_growth_and_release() {
    let mut h = Harness::new("expandable_segments:True", GIB80);
    let a = h.alloc(30 * MIB);
    let b = h.alloc(15 * MIB);
    assert_eq!(h.segment_events(), vec![("segment_map", 40 * MIB), ("segment_map", 20 * MIB)]);
    assert_eq!(h.stats().segment.all.current, 0);
    assert_eq!(h.stats().reserved_bytes.all.current, 60 * MIB as i64);
    let snap = h.snapshot();
    assert_eq!(snap.len(), 1);
    assert!(snap[0].is_expandable);
    assert_eq!(snap[0].total_size, 60 * MIB);
    h.free(a);
    h.empty_cache();
    // a's 30 MiB covers one whole 20 MiB page; the 10 MiB partial page stays mapped.
    assert_eq!(h.segment_events().last(), Some(&("segment_unmap", 20 * MIB)));
    let snap = h.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(snap[0].total_size, 40 * MIB);
    assert_consistent(&h);
    h.free(b);
    h.empty_cache();
    assert_eq!(h.stats().reserved_bytes.all.current, 0);
    assert!(h.snapshot().is_empty());
    assert_eq!(h.dev.reserved_bytes(), 0);
}

/// "Tried to allocate more than 1EB memory": refused before rounding, no stat touched but
/// `num_ooms` (every `Oom` event is counted), no panic on the largest sizes; bad fractions are
/// refused.
#[test]
fn absurd_inputs_are_refused_without_panics() {
    let mut h = Harness::new("", GIB80);
    for size in [1 << 60, u64::MAX, u64::MAX - 511] {
        assert!(h.malloc(size).is_err());
    }
    let s = h.stats();
    assert_eq!((s.num_ooms, s.allocation.all.allocated, s.reserved_bytes.all.current), (3, 0, 0));
    assert!(h.set_fraction(f64::NAN).is_err());
    // A request the device cannot hold is an ordinary OOM.
    assert!(h.malloc(GIB80 + 1).is_err());
    assert_eq!(h.stats().num_ooms, 4);
}
