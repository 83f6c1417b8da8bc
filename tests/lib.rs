//! Helpers for the workspace-level integration tests in `tests.rs`.

use std::path::PathBuf;

/// The bundled real traces (PyTorch snapshots with their recorded statistics): the ten shared
/// lab recordings, four held out from the PyTorch policy's development, and twenty-four
/// recorded the way users record them.
pub fn bundled_traces() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut traces = Vec::new();
    for dir in ["pytorch-2.11-h100", "pytorch-2.11-h100-extra", "pytorch-2.11-h100-user"] {
        let dir = root.join(dir);
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        traces.extend(
            entries
                .map(|entry| entry.expect("directory entry").path())
                .filter(|p| p.to_string_lossy().ends_with(".pickle.gz")),
        );
    }
    traces.sort();
    traces
}

/// Statistics of bundled recordings that the recording cannot determine: (trace, key, why).
/// The exactness test lets exactly these differ, and fails when one of them matches, so that
/// the list shrinks as the conversion learns more.
pub const UNDETERMINED_STATS: [(&str, &str, &str); 3] = [
    ("d_cudagraphs", "num_sync_all_streams", EMPTY_CACHE_FREEING_NOTHING),
    ("h_cudagraphs", "num_sync_all_streams", EMPTY_CACHE_FREEING_NOTHING),
    ("s_cudagraphs", "num_sync_all_streams", EMPTY_CACHE_FREEING_NOTHING),
];

/// Why [`UNDETERMINED_STATS`] lists the CUDA graph recordings.
const EMPTY_CACHE_FREEING_NOTHING: &str = "`torch.cuda.graph` calls `empty_cache` before each \
    capture; one that frees no segment counts in num_sync_all_streams but leaves no trace entry";

/// SHA-256 (FIPS 180-4) as a writer, so that the event-log test hashes each log as it is
/// written, holding no log in memory and adding no dependency to the build.
#[derive(Debug, Clone)]
pub struct Sha256 {
    state: [u32; 8],
    block: [u8; 64],
    filled: usize,
    bytes: u64,
}

const SHA256_K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

impl Default for Sha256 {
    fn default() -> Self {
        Sha256 {
            state: [
                0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
                0x5be0cd19,
            ],
            block: [0; 64],
            filled: 0,
            bytes: 0,
        }
    }
}

impl Sha256 {
    fn compress(&mut self) {
        let mut w = [0u32; 64];
        for (i, word) in self.block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = self.state;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 =
                h.wrapping_add(s1).wrapping_add(ch).wrapping_add(SHA256_K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let t2 = s0.wrapping_add((a & b) ^ (a & c) ^ (b & c));
            (h, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        for (s, v) in self.state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *s = s.wrapping_add(v);
        }
    }

    /// Bytes written.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The digest of everything written, in lowercase hex.
    pub fn hex(mut self) -> String {
        let bits = self.bytes.wrapping_mul(8);
        std::io::Write::write_all(&mut self, &[0x80]).unwrap();
        while self.filled != 56 {
            std::io::Write::write_all(&mut self, &[0]).unwrap();
        }
        std::io::Write::write_all(&mut self, &bits.to_be_bytes()).unwrap();
        self.state.iter().map(|word| format!("{word:08x}")).collect()
    }
}

impl std::io::Write for Sha256 {
    fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let written = buf.len();
        self.bytes += written as u64;
        while !buf.is_empty() {
            let take = (64 - self.filled).min(buf.len());
            self.block[self.filled..self.filled + take].copy_from_slice(&buf[..take]);
            (self.filled, buf) = (self.filled + take, &buf[take..]);
            if self.filled == 64 {
                self.compress();
                self.filled = 0;
            }
        }
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
