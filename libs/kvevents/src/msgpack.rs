//! A small, allocation-free msgpack reader for untrusted input.
//!
//! The engines' payloads are decoded on the hot path of every sidecar, and
//! they are untrusted: a frame can be truncated, claim a four-billion-element
//! array, or nest without end. This reader borrows from the input, never
//! allocates, checks every length against the bytes actually left, and skips
//! values iteratively with a depth limit, so no input can make it panic,
//! allocate without bound or overflow the stack.

use crate::error::WireError;

// Here rather than beside `WireError`: only the decoder names msgpack items.
impl WireError {
    pub(crate) fn type_mismatch(
        field: &'static str,
        expected: &'static str,
        found: Item<'_>,
    ) -> Self {
        Self::TypeMismatch {
            field,
            expected,
            found: found.kind(),
        }
    }
}

/// Deepest nesting a skipped value may have. Real payloads nest four deep.
const MAX_SKIP_DEPTH: usize = 64;

/// One msgpack item. Containers report their length; their elements follow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Item<'a> {
    Nil,
    Bool(bool),
    /// Any non-negative integer.
    UInt(u64),
    /// A negative integer.
    NegInt(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext,
}

impl Item<'_> {
    /// A short name for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Item::Nil => "nil",
            Item::Bool(_) => "bool",
            Item::UInt(_) | Item::NegInt(_) => "integer",
            Item::Float(_) => "float",
            Item::Str(_) => "string",
            Item::Bin(_) => "binary",
            Item::Array(_) => "array",
            Item::Map(_) => "map",
            Item::Ext => "extension",
        }
    }
}

/// A cursor over one msgpack buffer.
#[derive(Clone, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// A cursor over the same buffer at byte `pos` of it.
    pub(crate) fn at(other: &Self, pos: usize) -> Self {
        Self {
            buf: other.buf,
            pos: pos.min(other.buf.len()),
        }
    }

    /// The bytes read since `start`.
    pub(crate) fn since(&self, start: usize) -> &'a [u8] {
        &self.buf[start.min(self.pos)..self.pos]
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Truncated { offset: self.pos });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    fn be<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, WireError> {
        Ok(usize::from(self.byte()?))
    }
    fn len16(&mut self) -> Result<usize, WireError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }
    fn len32(&mut self) -> Result<usize, WireError> {
        usize::try_from(u32::from_be_bytes(self.be()?))
            .map_err(|_| WireError::TooLarge { offset: self.pos })
    }

    /// A container of `len` elements each at least `min_bytes` long must fit
    /// in what is left; otherwise the header lies and we stop here rather
    /// than trust it.
    fn container(&self, len: usize, min_bytes: usize) -> Result<usize, WireError> {
        if len.saturating_mul(min_bytes) > self.remaining() {
            Err(WireError::Truncated { offset: self.pos })
        } else {
            Ok(len)
        }
    }

    /// Reads the next item (for containers, only the header).
    #[inline]
    pub(crate) fn next(&mut self) -> Result<Item<'a>, WireError> {
        let start = self.pos;
        let marker = self.byte()?;
        let item = match marker {
            0x00..=0x7f => Item::UInt(u64::from(marker)),
            0x80..=0x8f => Item::Map(self.container(usize::from(marker & 0x0f), 2)?),
            0x90..=0x9f => Item::Array(self.container(usize::from(marker & 0x0f), 1)?),
            0xa0..=0xbf => Item::Str(self.take(usize::from(marker & 0x1f))?),
            0xc0 => Item::Nil,
            0xc2 => Item::Bool(false),
            0xc3 => Item::Bool(true),
            0xc4 => {
                let n = self.len8()?;
                Item::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.len16()?;
                Item::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.len32()?;
                Item::Bin(self.take(n)?)
            }
            0xc7 => {
                let n = self.len8()?;
                self.take(n + 1)?;
                Item::Ext
            }
            0xc8 => {
                let n = self.len16()?;
                self.take(n + 1)?;
                Item::Ext
            }
            0xc9 => {
                let n = self.len32()?;
                self.take(n.saturating_add(1))?;
                Item::Ext
            }
            0xca => Item::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Item::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Item::UInt(u64::from(self.byte()?)),
            0xcd => Item::UInt(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Item::UInt(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Item::UInt(u64::from_be_bytes(self.be()?)),
            0xd0 => int(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => int(i64::from_be_bytes(self.be()?)),
            0xd4 => {
                self.take(2)?;
                Item::Ext
            }
            0xd5 => {
                self.take(3)?;
                Item::Ext
            }
            0xd6 => {
                self.take(5)?;
                Item::Ext
            }
            0xd7 => {
                self.take(9)?;
                Item::Ext
            }
            0xd8 => {
                self.take(17)?;
                Item::Ext
            }
            0xd9 => {
                let n = self.len8()?;
                Item::Str(self.take(n)?)
            }
            0xda => {
                let n = self.len16()?;
                Item::Str(self.take(n)?)
            }
            0xdb => {
                let n = self.len32()?;
                Item::Str(self.take(n)?)
            }
            0xdc => {
                let n = self.len16()?;
                Item::Array(self.container(n, 1)?)
            }
            0xdd => {
                let n = self.len32()?;
                Item::Array(self.container(n, 1)?)
            }
            0xde => {
                let n = self.len16()?;
                Item::Map(self.container(n, 2)?)
            }
            0xdf => {
                let n = self.len32()?;
                Item::Map(self.container(n, 2)?)
            }
            0xe0..=0xff => Item::NegInt(i64::from(i8::from_be_bytes([marker]))),
            0xc1 => return Err(WireError::InvalidMarker { offset: start }),
        };
        Ok(item)
    }

    /// Skips one complete value (containers with everything inside them).
    pub(crate) fn skip(&mut self) -> Result<(), WireError> {
        // Items still to read at each open nesting level.
        let mut pending: [usize; MAX_SKIP_DEPTH] = [0; MAX_SKIP_DEPTH];
        let mut depth = 0usize;
        pending[0] = 1;
        loop {
            while pending[depth] == 0 {
                if depth == 0 {
                    return Ok(());
                }
                depth -= 1;
            }
            pending[depth] -= 1;
            let children = match self.next()? {
                Item::Array(n) => n,
                Item::Map(n) => n * 2,
                _ => 0,
            };
            if children > 0 {
                depth += 1;
                if depth >= MAX_SKIP_DEPTH {
                    return Err(WireError::TooDeep { offset: self.pos });
                }
                pending[depth] = children;
            }
        }
    }
}

fn int(v: i64) -> Item<'static> {
    if v >= 0 {
        Item::UInt(v.unsigned_abs())
    } else {
        Item::NegInt(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_scalars_of_every_width() {
        let cases: &[(&[u8], Item<'_>)] = &[
            (&[0x05], Item::UInt(5)),
            (&[0xcc, 0xff], Item::UInt(255)),
            (&[0xcd, 0x01, 0x00], Item::UInt(256)),
            (&[0xce, 0, 1, 0, 0], Item::UInt(65536)),
            (
                &[0xcf, 0xff, 0, 0, 0, 0, 0, 0, 1],
                Item::UInt(0xff00_0000_0000_0001),
            ),
            (&[0xff], Item::NegInt(-1)),
            (&[0xd0, 0x80], Item::NegInt(-128)),
            (&[0xd0, 0x05], Item::UInt(5)),
            (
                &[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe],
                Item::NegInt(-2),
            ),
            (&[0xc0], Item::Nil),
            (&[0xc3], Item::Bool(true)),
            (&[0xa3, b'G', b'P', b'U'], Item::Str(b"GPU")),
            (&[0xc4, 2, 9, 8], Item::Bin(&[9, 8])),
            (&[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0], Item::Float(1.5)),
            (&[0xca, 0x3f, 0xc0, 0, 0], Item::Float(1.5)),
        ];
        for (bytes, want) in cases {
            let mut r = Reader::new(bytes);
            assert_eq!(r.next().unwrap(), *want, "{bytes:x?}");
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        for bytes in [
            &[0xcf, 0, 0][..],
            &[0xa5, b'a'][..],
            &[0xdb, 0xff, 0xff, 0xff, 0xff][..],
            &[][..],
            &[0xc6, 0, 0, 0][..],
        ] {
            assert!(matches!(
                Reader::new(bytes).next(),
                Err(WireError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn lying_container_lengths_are_rejected_before_reading() {
        // array32 claiming 4 billion elements with 3 bytes left.
        let bytes = [0xdd, 0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        assert!(matches!(
            Reader::new(&bytes).next(),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn skip_handles_nesting_and_limits_depth() {
        // [1, {"a": [nil, true]}, "x"] then a trailing 7.
        let bytes = [
            0x93, 0x01, 0x81, 0xa1, b'a', 0x92, 0xc0, 0xc3, 0xa1, b'x', 0x07,
        ];
        let mut r = Reader::new(&bytes);
        r.skip().unwrap();
        assert_eq!(r.next().unwrap(), Item::UInt(7));

        let deep = vec![0x91u8; 1000];
        assert!(matches!(
            Reader::new(&deep).skip(),
            Err(WireError::TooDeep { .. } | WireError::Truncated { .. })
        ));
    }

    #[test]
    fn reserved_marker_is_rejected() {
        assert!(matches!(
            Reader::new(&[0xc1]).next(),
            Err(WireError::InvalidMarker { offset: 0 })
        ));
    }
}
