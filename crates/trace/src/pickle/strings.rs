//! A small cache of recently made short strings.
//!
//! CPython pickles equal strings that are distinct objects once each (a snapshot writes the
//! same `"N/A"` and `""` in every entry), and an allocation per string costs more than the
//! rest of reading it. Sharing them is invisible to users: strings are immutable.

use std::rc::Rc;

const SLOTS: usize = 512;
/// Longer strings are rarely repeated and not worth hashing.
const MAX_CACHED_BYTES: usize = 40;

pub struct StrCache {
    slots: Vec<Option<Rc<String>>>,
}

impl Default for StrCache {
    fn default() -> Self {
        StrCache { slots: vec![None; SLOTS] }
    }
}

impl StrCache {
    /// The shared string for `s`, made (and remembered) if it is not the one cached.
    #[inline]
    pub fn get(&mut self, s: &str) -> Rc<String> {
        if s.len() > MAX_CACHED_BYTES {
            return Rc::new(s.to_string());
        }
        // FNV-1a: short keys, no need for DoS resistance (a collision only costs a miss).
        let mut h: u32 = 0x811c_9dc5;
        for &b in s.as_bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        let slot = &mut self.slots[h as usize % SLOTS];
        match slot {
            Some(rc) if **rc == *s => rc.clone(),
            _ => {
                let rc = Rc::new(s.to_string());
                *slot = Some(rc.clone());
                rc
            }
        }
    }
}
