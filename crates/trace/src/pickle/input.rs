//! A buffered byte source that knows its offset and never allocates from a length it was told.
//!
//! The reader streams from a `Read` (usually a gzip decoder), so the length of what remains is
//! unknown: instead of trusting a length field, long payloads are copied chunk by chunk as the
//! bytes actually arrive, and a short input fails with `Eof` after allocating only what it had.

use std::io::{self, Read};

pub const BUF_BYTES: usize = 64 * 1024;

/// Why a read came back short.
#[derive(Debug)]
pub enum InputError {
    Eof,
    Io(io::Error),
    /// A long payload would take more memory than it may ([`Input::with_bytes`]).
    Limit,
}

impl From<io::Error> for InputError {
    fn from(e: io::Error) -> Self {
        InputError::Io(e)
    }
}

pub type InResult<T> = Result<T, InputError>;

pub struct Input<R> {
    inner: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
}

impl<R: Read> Input<R> {
    pub fn new(inner: R) -> Self {
        Input { inner, buf: vec![0; BUF_BYTES].into_boxed_slice(), pos: 0, end: 0, base: 0 }
    }

    /// Offset of the next byte in the stream.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Read more after the unread bytes, moving them to the front first. Returns bytes added.
    fn refill(&mut self) -> InResult<usize> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Make `n` (at most the buffer size) bytes available at `pos`.
    #[inline]
    fn ensure(&mut self, n: usize) -> InResult<()> {
        if self.end - self.pos >= n {
            return Ok(());
        }
        self.ensure_slow(n)
    }

    #[cold]
    fn ensure_slow(&mut self, n: usize) -> InResult<()> {
        debug_assert!(n <= BUF_BYTES);
        while self.end - self.pos < n {
            if self.refill()? == 0 {
                return Err(InputError::Eof);
            }
        }
        Ok(())
    }

    /// The next byte, or `None` at the end of the input.
    #[inline]
    pub fn next_byte(&mut self) -> InResult<Option<u8>> {
        if let Some(&b) = self.buf.get(self.pos).filter(|_| self.pos < self.end) {
            self.pos += 1;
            return Ok(Some(b));
        }
        self.next_byte_slow()
    }

    #[cold]
    fn next_byte_slow(&mut self) -> InResult<Option<u8>> {
        if self.pos == self.end && self.refill()? == 0 {
            return Ok(None);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }

    #[inline]
    pub fn byte(&mut self) -> InResult<u8> {
        self.next_byte()?.ok_or(InputError::Eof)
    }

    #[inline]
    pub fn array<const N: usize>(&mut self) -> InResult<[u8; N]> {
        self.ensure(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    /// The next `n` bytes (at most 8), copied out.
    #[inline]
    pub fn up_to_8(&mut self, n: usize) -> InResult<[u8; 8]> {
        self.ensure(n)?;
        let mut out = [0u8; 8];
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(out)
    }

    /// The buffered bytes at the cursor, at least `n` (at most the buffer size) of them unless
    /// the input ends first. Read them in place, then [`Input::consume`] what was used.
    #[inline]
    pub fn window(&mut self, n: usize) -> InResult<&[u8]> {
        if self.end - self.pos < n {
            self.fill_up_to(n)?;
        }
        Ok(&self.buf[self.pos..self.end])
    }

    #[cold]
    fn fill_up_to(&mut self, n: usize) -> InResult<()> {
        debug_assert!(n <= BUF_BYTES);
        while self.end - self.pos < n && self.refill()? > 0 {}
        Ok(())
    }

    /// Skip `n` bytes of the last [`Input::window`].
    #[inline]
    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.end - self.pos);
        self.pos += n;
    }

    /// Hand `n` bytes to `f` without copying when they are already buffered; otherwise gather
    /// them into `scratch` as they arrive, failing with `Limit` once the scratch buffer and a
    /// copy of what it holds could take more than `room` bytes (a `Vec` may hold twice its
    /// length), and with `Eof` if the input ends first.
    pub fn with_bytes<T>(
        &mut self,
        n: u64,
        scratch: &mut Vec<u8>,
        room: u64,
        f: impl FnOnce(&[u8]) -> T,
    ) -> InResult<T> {
        if n <= BUF_BYTES as u64 {
            let n = n as usize;
            self.ensure(n)?;
            let out = f(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(out);
        }
        scratch.clear();
        let mut left = n;
        while left > 0 {
            if self.pos == self.end && self.refill()? == 0 {
                return Err(InputError::Eof);
            }
            let take = (self.end - self.pos).min(usize::try_from(left).unwrap_or(usize::MAX));
            if 3 * (scratch.len() + take) as u64 > room {
                return Err(InputError::Limit);
            }
            scratch.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
            left -= take as u64;
        }
        Ok(f(scratch))
    }

    /// A text argument up to `\n` (protocol 0 opcodes), at most `max` bytes, without the newline.
    pub fn line(&mut self, max: usize, out: &mut Vec<u8>) -> InResult<bool> {
        out.clear();
        loop {
            let b = self.byte()?;
            if b == b'\n' {
                return Ok(true);
            }
            if out.len() == max {
                return Ok(false);
            }
            out.push(b);
        }
    }

    /// Read everything left, so that a compressed stream's trailer (its checksum) is checked.
    pub fn drain(&mut self) -> InResult<u64> {
        let mut total = (self.end - self.pos) as u64;
        self.pos = self.end;
        loop {
            let n = self.refill()?;
            if n == 0 {
                return Ok(total);
            }
            total += n as u64;
            self.pos = self.end;
        }
    }
}
