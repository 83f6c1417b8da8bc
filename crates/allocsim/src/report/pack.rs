//! The report page's compact columns: each column a run of LEB128 varints, all of a table
//! compressed together (zlib, which the page inflates with the browser's
//! `DecompressionStream("deflate")`) and written as base64, a string with no character the
//! HTML or JSON parser treats specially. A million allocations take a few MB where JSON
//! arrays took tens.

use allocsim_core::varint;
use serde_json::{json, Value};
use std::io::Write;

/// Named columns of unsigned integers, written as varints.
#[derive(Default)]
pub struct Columns {
    names: Vec<&'static str>,
    bytes: Vec<Vec<u8>>,
    rows: Vec<u64>,
}

impl Columns {
    /// A table with these columns (each present, if empty, for the page to read).
    pub fn with(names: &[&'static str]) -> Columns {
        let mut columns = Columns::default();
        for &name in names {
            columns.col(name);
        }
        columns
    }

    /// The column `name`, made on first use; columns keep the order of their first use.
    pub fn col(&mut self, name: &'static str) -> Col<'_> {
        let i = match self.names.iter().position(|&n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name);
                self.bytes.push(Vec::new());
                self.rows.push(0);
                self.names.len() - 1
            }
        };
        Col { bytes: &mut self.bytes[i], rows: &mut self.rows[i] }
    }

    /// `{"names": [...], "rows": [...], "lengths": [...], "data": BASE64}`: each column's
    /// varint count and byte length, then all of them, in that order, compressed.
    pub fn to_json(&self) -> Value {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
        for b in &self.bytes {
            // Writing to a Vec cannot fail.
            z.write_all(b).expect("writing to memory");
        }
        let zipped = z.finish().expect("writing to memory");
        json!({
            "names": self.names,
            "rows": self.rows,
            "lengths": self.bytes.iter().map(Vec::len).collect::<Vec<_>>(),
            "data": base64(&zipped),
        })
    }
}

pub struct Col<'a> {
    bytes: &'a mut Vec<u8>,
    rows: &'a mut u64,
}

impl Col<'_> {
    /// One value, as a LEB128 varint.
    pub fn push(&mut self, v: u64) {
        *self.rows += 1;
        varint::put(self.bytes, v);
    }

    /// A signed value, zigzag-encoded (small magnitudes stay short).
    pub fn push_signed(&mut self, v: i64) {
        self.push(varint::zigzag(v));
    }
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn base64_reads_back_as_written() {
        // Against the standard's examples (RFC 4648 §10).
        for (plain, coded) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(plain.as_bytes()), coded);
        }
    }

    #[test]
    fn columns_inflate_to_their_varints() {
        let mut c = Columns::default();
        let values = [0u64, 1, 127, 128, 300, u64::from(u32::MAX), 1 << 53];
        for &v in &values {
            c.col("a").push(v);
        }
        c.col("b").push_signed(-3);
        let j = c.to_json();
        assert_eq!(j["rows"], json!([values.len(), 1]));
        let data = decode64(j["data"].as_str().unwrap());
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&data[..]).read_to_end(&mut raw).unwrap();
        let len_a = j["lengths"][0].as_u64().unwrap() as usize;
        let (mut at, mut read) = (0, Vec::new());
        while at < len_a {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let b = raw[at];
                at += 1;
                v |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b < 0x80 {
                    break;
                }
            }
            read.push(v);
        }
        assert_eq!(read, values);
        assert_eq!(raw[len_a..], [5]); // zigzag(-3)
    }

    fn decode64(s: &str) -> Vec<u8> {
        let abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let bits: Vec<u32> =
            s.bytes().filter(|&b| b != b'=').map(|b| abc.find(b as char).unwrap() as u32).collect();
        let mut out = Vec::new();
        for q in bits.chunks(4) {
            let n = q.iter().enumerate().fold(0, |n, (k, &v)| n | (v << (18 - 6 * k)));
            out.extend(n.to_be_bytes()[1..q.len()].iter());
        }
        out
    }
}
