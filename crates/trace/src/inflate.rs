//! Gzip decompression on a thread of its own, a few blocks ahead of the reader.
//!
//! Inflating is about a tenth of reading a snapshot, and the pickle reader cannot start on a
//! byte before it is inflated: running the two side by side takes inflation off the critical
//! path. The bytes, and so every result and error, are exactly those of reading the decoder
//! directly; only the wall time changes.

use flate2::bufread::MultiGzDecoder;
use std::io::{self, BufRead, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Bytes per block handed from the inflating thread to the reader: `SMALL_BLOCK` for the first
/// `SMALL_UNTIL` bytes, then `BLOCK`. The blocks in flight are memory first touched (a fresh
/// page takes about 2 µs to fault in on the machines of `benches/README.md`), which a small
/// file feels; a large one feels each hand-over between the threads more.
const SMALL_BLOCK: usize = 64 * 1024;
const SMALL_UNTIL: usize = 2 << 20;
const BLOCK: usize = 256 * 1024;
/// Blocks inflated ahead of the reader: enough to keep both busy, little memory.
const AHEAD: usize = 4;

/// The decompressed stream of a gzip file, inflated on another thread.
pub struct Inflater {
    blocks: Receiver<io::Result<Vec<u8>>>,
    /// Read blocks go back to the inflating thread for reuse (no fresh pages to fault in).
    spare: SyncSender<Vec<u8>>,
    block: Vec<u8>,
    pos: usize,
}

impl Inflater {
    pub fn new(mut decoder: MultiGzDecoder<impl BufRead + Send + 'static>) -> Self {
        let (send, blocks) = sync_channel(AHEAD);
        let (spare, reuse) = sync_channel::<Vec<u8>>(AHEAD + 2);
        let mut inflated = 0;
        std::thread::spawn(move || loop {
            let size = if inflated < SMALL_UNTIL { SMALL_BLOCK } else { BLOCK };
            let mut block = reuse.try_recv().unwrap_or_else(|_| vec![0; size]);
            // Filled by `read` into initialised bytes: `read_to_end` would zero the spare
            // capacity of every block before each fill (as much work as copying it).
            block.resize(size, 0);
            let (filled, error) = fill(&mut decoder, &mut block);
            inflated += filled;
            block.truncate(filled);
            let sent = match error {
                // The end: dropping `send` tells the reader.
                None if filled == 0 => return,
                None => send.send(Ok(block)),
                // The bytes before the error, then the error, as the decoder gives them.
                Some(e) => {
                    if !block.is_empty() {
                        let _ = send.send(Ok(block));
                    }
                    let _ = send.send(Err(e));
                    return;
                }
            };
            if sent.is_err() {
                // The reader went away (an error elsewhere, or it read enough).
                return;
            }
        });
        Inflater { blocks, spare, block: Vec::new(), pos: 0 }
    }
}

/// Read into `block` until it is full or the stream ends: the bytes read, and the error that
/// stopped it, if any.
fn fill(decoder: &mut impl Read, block: &mut [u8]) -> (usize, Option<io::Error>) {
    let mut filled = 0;
    while filled < block.len() {
        match decoder.read(&mut block[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return (filled, Some(e)),
        }
    }
    (filled, None)
}

impl Read for Inflater {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.block.len() {
            let used = std::mem::take(&mut self.block);
            // The thread may have finished: the block is then simply dropped.
            let _ = self.spare.try_send(used);
            self.pos = 0;
            self.block = match self.blocks.recv() {
                Ok(block) => block?,
                // The thread ends after the last block (or its error).
                Err(_) => return Ok(0),
            };
        }
        let n = buf.len().min(self.block.len() - self.pos);
        buf[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::fs::File;
    use std::io::{BufReader, Write};

    fn gz_file(data: &[u8], name: &str) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("allocsim-inflate-{}-{name}", std::process::id()));
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(data).unwrap();
        std::fs::write(&path, enc.finish().unwrap()).unwrap();
        path
    }

    fn open(path: &std::path::Path) -> Inflater {
        let file = BufReader::new(File::open(path).unwrap());
        Inflater::new(MultiGzDecoder::new(file))
    }

    #[test]
    fn same_bytes_as_the_decoder() {
        // Small blocks, then several large ones and a partial one, in odd-sized reads.
        let len = SMALL_UNTIL + 3 * BLOCK + 12345;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let path = gz_file(&data, "whole");
        let mut out = Vec::new();
        let mut r = open(&path);
        let mut buf = [0u8; 1000];
        loop {
            let n = r.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out, data);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn truncated_file_gives_the_decoder_error() {
        let data: Vec<u8> = (0..(SMALL_UNTIL + 2 * BLOCK)).map(|i| (i % 13) as u8).collect();
        let path = gz_file(&data, "cut");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let mut direct = Vec::new();
        let direct_err = MultiGzDecoder::new(BufReader::new(File::open(&path).unwrap()))
            .read_to_end(&mut direct)
            .unwrap_err();
        let mut piped = Vec::new();
        let piped_err = open(&path).read_to_end(&mut piped).unwrap_err();
        assert_eq!(piped_err.kind(), direct_err.kind());
        assert_eq!(piped_err.to_string(), direct_err.to_string());
        assert_eq!(piped, direct, "the bytes before the error");
        std::fs::remove_file(path).unwrap();
    }
}
