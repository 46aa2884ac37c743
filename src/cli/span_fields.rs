//! A span's fields as the JSON object the JSON log writes for it in `spans[]`, written
//! straight into the span's text. Every delivery opens a span, so this runs once per
//! request: the formatter tracing-subscriber ships builds a map of JSON values and a
//! second string first.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// Span fields as one JSON object, in the order they are recorded. The JSON log parses the
/// object back when it writes a line, so a field recorded twice ends as its last value.
pub struct JsonSpanFields;

impl<'w> FormatFields<'w> for JsonSpanFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut text = Gathered::new(&mut writer);
        text.write_char('{')?;
        let mut object = Members::new(&mut text, false);
        fields.record(&mut object);
        object.result?;
        text.write_char('}')?;
        text.flush()
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        // `{…}` loses its closing brace, takes the new members and gets it back.
        if current.fields.pop() != Some('}') {
            current.fields.clear();
            current.fields.push('{');
        }
        let has_members = current.fields.len() > 1;
        let mut object = Members::new(&mut current.fields, has_members);
        fields.record(&mut object);
        let result = object.result;
        current.fields.push('}');
        result
    }
}

/// Text gathered on the stack and written on in one piece: the writer of a new span's
/// fields appends to an empty string, which would grow at each of the object's pieces,
/// and is allocated once, at its size, this way.
struct Gathered<'a, W: Write> {
    buffer: [u8; 256],
    len: usize,
    out: &'a mut W,
}

impl<'a, W: Write> Gathered<'a, W> {
    fn new(out: &'a mut W) -> Self {
        Self {
            buffer: [0; 256],
            len: 0,
            out,
        }
    }

    /// Writes what is gathered on.
    fn flush(&mut self) -> fmt::Result {
        // Whole `str`s are copied in, so the bytes are always UTF-8.
        let text = std::str::from_utf8(&self.buffer[..self.len]).map_err(|_| fmt::Error)?;
        self.out.write_str(text)?;
        self.len = 0;
        Ok(())
    }
}

impl<W: Write> Write for Gathered<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.len + s.len() > self.buffer.len() {
            self.flush()?;
            if s.len() > self.buffer.len() {
                return self.out.write_str(s);
            }
        }
        self.buffer[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
        self.len += s.len();
        Ok(())
    }
}

/// Writes each recorded field as a `"name":value` member.
struct Members<'a, W: Write> {
    out: &'a mut W,
    /// Whether a member was written before: the next one needs a comma.
    follows: bool,
    result: fmt::Result,
}

impl<'a, W: Write> Members<'a, W> {
    fn new(out: &'a mut W, follows: bool) -> Self {
        Self {
            out,
            follows,
            result: Ok(()),
        }
    }

    fn member(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let out = &mut *self.out;
        self.result = (|| {
            if self.follows {
                out.write_char(',')?;
            }
            json_string(out, field.name())?;
            out.write_char(':')?;
            value(out)
        })();
        self.follows = true;
    }
}

impl<W: Write> Visit for Members<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, |out| json_string(out, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, |out| json_string(out, &format!("{value:?}")));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |out| write!(out, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity: such a value is written as null, as serde_json does.
        if value.is_finite() {
            self.member(field, |out| write!(out, "{value:?}"));
        } else {
            self.member(field, |out| out.write_str("null"));
        }
    }
}

/// `text` as a JSON string. A text with nothing to escape (a trace id, an address) is
/// written as it is; any other goes through serde_json's escaping.
fn json_string(out: &mut impl Write, text: &str) -> fmt::Result {
    // JSON escapes the bytes below space, the quote and the backslash, nothing else.
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.write_char('"')?;
        out.write_str(text)?;
        return out.write_char('"');
    }
    out.write_str(&serde_json::to_string(text).map_err(|_| fmt::Error)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_text(text: &str) -> String {
        let mut out = String::new();
        let _ = json_string(&mut out, text);
        out
    }

    #[test]
    fn strings_read_back_as_the_text_they_were_made_of() {
        for text in [
            "",
            "0af7651916cd43dd8448eb211c80319c",
            "quote \" back \\ tab \t nl \n cr \r bell \u{7} nul \u{0} é ✓ \u{7f}",
        ] {
            let written = json_text(text);
            let read: String = serde_json::from_str(&written).unwrap_or_default();
            assert_eq!(read, text, "{written}");
        }
    }

    /// A writer that keeps each piece written to it.
    #[derive(Default)]
    struct Pieces(Vec<String>);

    impl Write for Pieces {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0.push(s.to_owned());
            Ok(())
        }
    }

    #[test]
    fn gathered_text_reaches_the_writer_whole_and_in_as_few_pieces_as_fit() {
        let small = [
            "{",
            "\"trace_id\"",
            ":",
            "\"0af7651916cd43dd8448eb211c80319c\"",
            "}",
        ];
        let mut out = Pieces::default();
        let mut text = Gathered::new(&mut out);
        for piece in small {
            text.write_str(piece).unwrap_or_default();
        }
        text.flush().unwrap_or_default();
        assert_eq!(out.0, vec![small.concat()], "a span's object is one write");

        let pieces = [
            "é✓".repeat(40),
            "x".repeat(300),
            "ü".repeat(100),
            "y".into(),
        ];
        let mut out = Pieces::default();
        let mut text = Gathered::new(&mut out);
        for piece in &pieces {
            text.write_str(piece).unwrap_or_default();
        }
        text.flush().unwrap_or_default();
        assert_eq!(out.0.concat(), pieces.concat());
        assert!(out.0.iter().all(|p| !p.is_empty()), "{:?}", out.0);
    }
}
