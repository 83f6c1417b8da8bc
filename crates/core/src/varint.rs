//! LEB128 varints and zigzag signs: how the native file format, packed ops and the report's
//! columns write integers that are mostly small. Readers stay with their callers: a file's
//! reader checks bounds on untrusted bytes, packed ops read bytes they wrote.

/// A signed value as an unsigned one whose small magnitudes stay small.
#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The inverse of [`zigzag`].
#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// `v` appended to `bytes` as a LEB128 varint: seven bits a byte, the high bit set on all but
/// the last.
#[inline]
pub fn put(bytes: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        bytes.push(v as u8 | 0x80);
        v >>= 7;
    }
    bytes.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trips_and_keeps_small_magnitudes_small() {
        for v in [0, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!([zigzag(0), zigzag(-1), zigzag(1), zigzag(-3)], [0, 1, 2, 5]);
    }

    #[test]
    fn put_writes_seven_bits_a_byte() {
        let mut b = Vec::new();
        put(&mut b, 0x7f);
        put(&mut b, 300);
        put(&mut b, u64::MAX);
        assert_eq!(b[..3], [0x7f, 0xac, 0x02]);
        assert_eq!(b.len(), 3 + 10);
    }
}
