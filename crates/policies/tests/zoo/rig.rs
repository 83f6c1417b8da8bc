//! The zoo tests' rig: one policy on the simple test device, with every event it emits
//! checked by `allocsim-check`'s `Checker` and its statistics by `testgen`'s
//! `_check_memory_stat_consistency` oracle after every call. The random programs every policy
//! runs under are `allocsim-testgen`'s property suites, not here.

use allocsim_core::{AllocId, Allocator, Env, Event, Granted, OomInfo, StreamId};
use allocsim_sim::SimDevice;
use allocsim_testgen::oracles::{implied_free_space, stat_consistency, PYTORCH_ACCOUNTING};

/// A policy on [`SimDevice::for_tests`], checked after every call.
pub struct Rig {
    pub device: SimDevice,
    pub events: Vec<Event>,
    pub policy: Box<dyn Allocator>,
    checker: allocsim_check::Checker,
    calls: u64,
    label: String,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig").field("label", &self.label).finish_non_exhaustive()
    }
}

impl Rig {
    pub fn new(name: &str, conf: Option<&str>, capacity: u64) -> Rig {
        let policy =
            allocsim_policies::by_name(name, conf).unwrap_or_else(|e| panic!("{name}: {e}"));
        Rig::with_policy(name, policy, capacity)
    }

    /// A rig around a policy built elsewhere (one not registered, say).
    pub fn with_policy(name: &str, policy: Box<dyn Allocator>, capacity: u64) -> Rig {
        let config = allocsim_check::CheckConfig {
            alignment_bytes: policy.block_alignment(),
            ..allocsim_check::CheckConfig::new(capacity)
        };
        Rig {
            device: SimDevice::for_tests(capacity),
            events: Vec::new(),
            policy,
            checker: allocsim_check::Checker::new(config),
            calls: 0,
            label: name.to_string(),
        }
    }

    /// Run `call` on the policy, then check what it did.
    fn call<T>(&mut self, call: impl FnOnce(&mut dyn Allocator, &mut Env<'_>) -> T) -> T {
        let seen = self.events.len();
        let result = call(self.policy.as_mut(), &mut Env::new(&mut self.device, &mut self.events));
        for (i, e) in self.events.iter().enumerate().skip(seen) {
            self.checker.on_event(i as u64, self.calls, e);
        }
        self.checker.on_stats(self.events.len() as u64, self.calls, &self.policy.stats());
        self.calls += 1;
        if let Some(v) = self.checker.violations().first() {
            panic!("{}: allocsim-check: {v}", self.label);
        }
        let snapshot = self.policy.snapshot();
        let pytorch_rules = PYTORCH_ACCOUNTING.contains(&self.label.as_str());
        let problems = stat_consistency(&snapshot, &self.policy.stats(), pytorch_rules);
        assert!(problems.is_empty(), "{}: {problems:?}", self.label);
        let (reported, implied) = (self.policy.free_space(), implied_free_space(&snapshot));
        assert_eq!(reported, implied, "{}: free_space", self.label);
        result
    }

    pub fn malloc(&mut self, id: u64, size: u64, stream: u64) -> Result<Granted, OomInfo> {
        let r = self.call(|p, env| p.malloc(env, AllocId(id), size, StreamId(stream)));
        let ends_right = match (&r, self.events.last()) {
            (Ok(g), Some(Event::Alloc { id: i, addr, size, .. })) => {
                (*i, *addr, *size) == (AllocId(id), g.addr, g.size)
            }
            (Err(_), Some(Event::Oom { id: i, .. })) => *i == AllocId(id),
            _ => false,
        };
        assert!(ends_right, "{}: malloc of id {id} did not end with its Alloc or Oom", self.label);
        r
    }

    pub fn free(&mut self, id: u64) {
        self.call(|p, env| p.free(env, AllocId(id)));
    }

    pub fn empty_cache(&mut self) {
        self.call(|p, env| p.empty_cache(env));
    }

    pub fn reserved(&self) -> u64 {
        self.policy.stats().reserved_bytes.all.current as u64
    }
}
