//! The kit itself: a wrong placement is not trusted; bad settings change nothing.

use crate::rig::Rig;
use allocsim_core::{Allocator, StreamId, MIB};
use allocsim_policies::kit::{Apply, Kit, Rules, Setting, Tiling};

/// Places every block at the first chunk, free or not: the kit must not trust it.
#[derive(Debug, Default, Clone)]
struct Careless {
    limit: u64,
}

impl Rules for Careless {
    const NAME: &'static str = "careless";
    const SETTINGS: &'static [Setting<Self>] = &[Setting {
        key: "limit",
        help: "a byte count at most 1 GiB",
        apply: Apply::Bytes(|rules, v| rules.limit = v),
    }];
    type Tag = ();

    fn place(&self, tiling: &Tiling<()>, _: u64, _: StreamId) -> Option<u64> {
        tiling.segments().next().map(|(base, _)| base)
    }

    fn check(&mut self, _: &Self, _: bool) -> Result<(), String> {
        (self.limit <= 1 << 30).then_some(()).ok_or_else(|| "limit over 1 GiB".to_string())
    }
}

#[test]
fn a_wrong_placement_is_not_trusted() {
    let mut kit = Kit::<Careless>::default();
    let mut rig = Rig::with_policy("careless", Box::new(Kit::<Careless>::default()), 1 << 30);
    let a = rig.malloc(1, MIB, 0).unwrap();
    let b = rig.malloc(2, MIB, 0).unwrap();
    assert_ne!(a.addr, b.addr, "the first chunk was taken: b gets other memory");
    // Settings: an unknown key, a bad value and a failed check all name the policy and
    // leave the rules as they were.
    assert!(kit.set_settings("limit:1MiB").is_ok());
    for (conf, says) in [
        ("size:1", "unknown setting"),
        ("limit:lots", "limit:\"lots\": not a byte count"),
        ("limit:2GiB", "limit over 1 GiB"),
    ] {
        let e = kit.set_settings(conf).unwrap_err().0;
        assert!(e.starts_with("policy careless:") && e.contains(says), "{conf}: {e}");
        assert_eq!(kit.rules.limit, MIB, "{conf} changed nothing");
    }
}

/// `settings!` takes each setting's help from its doc comment, and its key from its name.
#[test]
fn settings_read_their_help_from_doc_comments() {
    let settings = allocsim_policies::zoo::bfc::BfcRules::SETTINGS;
    let keys: Vec<&str> = settings.iter().map(|s| s.key).collect();
    assert_eq!(
        keys,
        ["allow_growth", "memory_limit", "garbage_collection", "fragmentation_fraction"]
    );
    assert_eq!(settings[2].help, "give wholly free regions back before an OOM");
}
