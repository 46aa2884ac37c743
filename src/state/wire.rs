//! The pieces of the compact binary forms state is stored in (decision records, guard
//! state): LEB128 varints, zigzag for signed integers, text with its length, and ids of
//! the two common shapes (a UUID, `req_<ulid>`) in 16 bytes. [`Reader`] checks every read,
//! so bytes of another form read as `None`, never as a wrong value.

/// Id forms: none, a UUID (16 bytes), `req_` and a ULID (16 bytes), text.
const ID_NONE: u8 = 0;
const ID_UUID: u8 = 1;
const ID_ULID: u8 = 2;
const ID_TEXT: u8 = 3;
const ULID_PREFIX: &str = "req_";
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A signed integer as a zigzag varint: small magnitudes of either sign stay short.
pub fn put_signed(out: &mut Vec<u8>, v: i64) {
    put_varint(out, zigzag(v));
}

/// Text as its length (varint) and its bytes.
pub fn put_text(out: &mut Vec<u8>, text: &str) {
    put_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

/// An id, packed when it has a common shape that prints back to the same text: a record
/// must give the id exactly as the sender's ticket shows it.
pub fn put_id(out: &mut Vec<u8>, id: Option<&str>) {
    let Some(id) = id else {
        out.push(ID_NONE);
        return;
    };
    if let Ok(uuid) = uuid::Uuid::parse_str(id) {
        if *uuid
            .hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            == *id
        {
            out.push(ID_UUID);
            out.extend_from_slice(uuid.as_bytes());
            return;
        }
    }
    if let Some(bits) = id.strip_prefix(ULID_PREFIX).and_then(ulid_bits) {
        out.push(ID_ULID);
        out.extend_from_slice(&bits.to_be_bytes());
        return;
    }
    out.push(ID_TEXT);
    put_text(out, id);
}

/// The 128 bits of a ULID in its canonical form (26 upper-case Crockford characters).
fn ulid_bits(text: &str) -> Option<u128> {
    if text.len() != 26 || text.as_bytes()[0] > b'7' {
        return None;
    }
    text.bytes().try_fold(0u128, |acc, c| {
        let digit = CROCKFORD.iter().position(|d| *d == c)?;
        Some((acc << 5) | digit as u128)
    })
}

fn ulid_text(bits: u128) -> String {
    (0..26)
        .rev()
        .map(|i| char::from(CROCKFORD[((bits >> (i * 5)) & 31) as usize]))
        .collect()
}

/// Reads stored bytes front to back; every read is checked.
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    pub fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }

    pub fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    pub fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// [`put_signed`]'s integer.
    pub fn signed(&mut self) -> Option<i64> {
        Some(unzigzag(self.varint()?))
    }

    /// [`put_text`]'s text.
    pub fn text(&mut self) -> Option<String> {
        let len = usize::try_from(self.varint()?).ok()?;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    /// [`put_id`]'s id; the outer `None` is malformed bytes.
    pub fn id(&mut self) -> Option<Option<String>> {
        Some(match self.byte()? {
            ID_NONE => None,
            ID_UUID => {
                let bytes: [u8; 16] = self.take(16)?.try_into().ok()?;
                Some(uuid::Uuid::from_bytes(bytes).hyphenated().to_string())
            }
            ID_ULID => {
                let bytes: [u8; 16] = self.take(16)?.try_into().ok()?;
                Some(format!(
                    "{ULID_PREFIX}{}",
                    ulid_text(u128::from_be_bytes(bytes))
                ))
            }
            ID_TEXT => Some(self.text()?),
            _ => return None,
        })
    }

    /// Whether every byte was read: a form followed by more bytes is not that form.
    pub fn is_done(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_text_and_ids_read_back_as_written() {
        let ids = [
            None,
            Some("3f1c2a9e-8b7d-4c6a-9f0e-1d2c3b4a5f60"),
            Some("req_01HZX3J8Q4K7M2N5P9R6S8T0VW"),
            // Shapes that do not print back the same stay text.
            Some("3F1C2A9E-8B7D-4C6A-9F0E-1D2C3B4A5F60"),
            Some("req_81HZX3J8Q4K7M2N5P9R6S8T0VW"),
            Some("evt_1"),
            Some(""),
        ];
        for id in ids {
            for v in [0, 1, -1, i64::MAX, i64::MIN, 1_780_000_000_123] {
                let mut out = Vec::new();
                put_signed(&mut out, v);
                put_id(&mut out, id);
                put_text(&mut out, "delivered");
                let mut r = Reader(&out);
                assert_eq!(r.signed(), Some(v));
                assert_eq!(r.id(), Some(id.map(str::to_owned)));
                assert_eq!(r.text().as_deref(), Some("delivered"));
                assert!(r.is_done());
            }
        }
        let mut uuid = Vec::new();
        put_id(&mut uuid, ids[1]);
        assert_eq!(uuid.len(), 17, "a UUID takes its 16 bytes and the form's");
    }

    #[test]
    fn cut_short_or_unknown_bytes_read_as_none() {
        let mut out = Vec::new();
        put_text(&mut out, "delivered");
        assert_eq!(Reader(&out[..4]).text(), None);
        assert_eq!(Reader(&[9]).id(), None);
        assert_eq!(Reader(&[0xff; 11]).varint(), None);
        assert_eq!(Reader(&[2, 0xff, 0xfe]).text(), None, "not UTF-8");
    }
}
