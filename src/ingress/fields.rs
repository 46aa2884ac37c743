//! Reading the configured fields (JSON Pointers, RFC 6901) out of an event body in one pass;
//! a form-encoded body (Twilio's) is read with the same pointers, `/Body` naming the field
//! `Body`.
//!
//! A route's pointers (event id, type and time, and the guard's) are merged into a tree when
//! the config is loaded. A body is then read once: members on a pointer's path are followed,
//! everything else is checked and skipped, and only the values the pointers name are kept.
//! Building a `serde_json::Value` of the whole body allocated every key and string (about 40
//! allocations and frees for a status event), and `Value::pointer` unescaped the pointer text
//! again on every lookup.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Where a pointer's value is kept in [`Extracted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

/// A kept value, as a reader sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Field<'a> {
    /// A JSON string.
    Text(&'a str),
    /// A JSON number.
    Number(&'a serde_json::Number),
    /// `null`.
    Null,
    /// `true`, `false`, an object or an array.
    Other,
}

impl<'a> Field<'a> {
    /// The value as text: strings as they are, numbers as JSON writes them.
    pub fn text(self) -> Option<Cow<'a, str>> {
        match self {
            Field::Text(s) => Some(Cow::Borrowed(s)),
            Field::Number(n) => Some(Cow::Owned(n.to_string())),
            Field::Null | Field::Other => None,
        }
    }
}

/// A kept value as held: a string without escapes stays where it is in the body, so
/// reading the fields the guard compares copies none of them.
#[derive(Debug, Clone)]
enum Kept {
    InBody { at: usize, len: usize },
    Text(String),
    Number(serde_json::Number),
    Null,
    Other,
}

/// The values found for a plan's pointers, by slot; `None` where the body has no such value.
#[derive(Debug, Clone, Default)]
pub struct Extracted {
    values: Vec<Option<Kept>>,
    /// The body the values were read from (a handle, not a copy).
    body: Bytes,
}

impl Extracted {
    /// `slots` values, none found yet. Filled by `resize_with`: `vec![None; n]` would
    /// clone its `None` through `Kept`'s `Clone` for every slot, on every delivery.
    fn empty(slots: usize, body: Bytes) -> Self {
        let mut values = Vec::with_capacity(slots);
        values.resize_with(slots, || None);
        Self { values, body }
    }

    /// The value at `slot`, if the body has one.
    pub fn get(&self, slot: Slot) -> Option<Field<'_>> {
        Some(match self.values.get(slot.0)?.as_ref()? {
            // The span was cut from the body at UTF-8 boundaries of a string checked as
            // UTF-8: this check of its few bytes does not fail.
            Kept::InBody { at, len } => {
                Field::Text(std::str::from_utf8(self.body.get(*at..at + len)?).ok()?)
            }
            Kept::Text(text) => Field::Text(text),
            Kept::Number(n) => Field::Number(n),
            Kept::Null => Field::Null,
            Kept::Other => Field::Other,
        })
    }

    /// The value at `slot` as owned text (as [`Field::text`] gives it), taken out: the
    /// slot is empty afterwards. For a slot only one reader looks at
    /// ([`FieldPlan::is_shared`]), whose unescaped string need not be copied twice.
    pub fn take_text(&mut self, slot: Slot) -> Option<String> {
        let kept = self.values.get_mut(slot.0)?.take()?;
        match kept {
            Kept::Text(text) => Some(text),
            Kept::Number(n) => Some(n.to_string()),
            Kept::InBody { at, len } => {
                let bytes = self.body.get(at..at + len)?;
                std::str::from_utf8(bytes).ok().map(str::to_owned)
            }
            Kept::Null | Kept::Other => None,
        }
    }
}

/// Why a body could not be read: not JSON, not an object, or nested too deep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnObject;

/// A route's pointers, merged into a tree of member names and array indexes.
#[derive(Debug, Clone, Default)]
pub struct FieldPlan {
    root: Node,
    slots: usize,
    /// The slots handed out for more than one pointer added.
    shared: Vec<usize>,
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// The slot of a pointer that ends here.
    slot: Option<usize>,
    children: Vec<Child>,
}

#[derive(Debug, Clone)]
struct Child {
    /// The unescaped reference token.
    token: String,
    /// The token as an array index, when it is one.
    index: Option<usize>,
    node: Node,
}

impl FieldPlan {
    /// Adds a pointer: empty (the whole document) or `/`-separated tokens, `~1` standing for
    /// `/` and `~0` for `~`. Text that is not a pointer (config validation refuses it) gets a
    /// slot that stays empty, as `Value::pointer` finds nothing for it. A pointer added
    /// again shares the first one's slot (a Twilio route's guard reads `/MessageSid` too).
    pub fn add(&mut self, pointer: &str) -> Slot {
        let slot = Slot(self.slots);
        let tokens: Vec<String> = match pointer.strip_prefix('/') {
            _ if pointer.is_empty() => Vec::new(),
            Some(rest) => rest
                .split('/')
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect(),
            None => {
                self.slots += 1;
                return slot;
            }
        };
        let mut node = &mut self.root;
        for token in tokens {
            let at = match node.children.iter().position(|c| c.token == token) {
                Some(at) => at,
                None => {
                    node.children.push(Child {
                        index: array_index(&token),
                        token,
                        node: Node::default(),
                    });
                    node.children.len() - 1
                }
            };
            node = &mut node.children[at].node;
        }
        if let Some(existing) = node.slot {
            self.shared.push(existing);
            return Slot(existing);
        }
        self.slots += 1;
        node.slot = Some(slot.0);
        slot
    }

    /// Whether `slot` was handed out for more than one pointer added: then more than one
    /// reader looks at its value.
    pub fn is_shared(&self, slot: Slot) -> bool {
        self.shared.contains(&slot.0)
    }

    /// Reads `body`, which must be one JSON object, and keeps the values of the pointers.
    pub fn extract(&self, body: &Bytes) -> Result<Extracted, NotAnObject> {
        // JSON is UTF-8 throughout: checked here once, in one pass, rather than string by
        // string as the slice reader does.
        let text = std::str::from_utf8(body).map_err(|_| NotAnObject)?;
        let mut out = Extracted::empty(self.slots, body.clone());
        let mut de = serde_json::Deserializer::from_str(text);
        Walk {
            node: &self.root,
            out: &mut out,
            top: true,
            body: text,
        }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|_| NotAnObject)?;
        Ok(out)
    }
}

impl FieldPlan {
    /// Reads a form-encoded body (`a=1&b=2`). A form is flat: a pointer of one token names
    /// a field, and gets its value as text (the last one if the field repeats); the whole
    /// document and deeper pointers find nothing. Any bytes are a form, so this cannot fail.
    pub fn extract_form(&self, body: &[u8]) -> Extracted {
        let mut out = Extracted::empty(self.slots, Bytes::new());
        for (name, value) in form_urlencoded::parse(body) {
            let child = self.root.children.iter().find(|c| c.token == name);
            if let Some(slot) = child.and_then(|c| c.node.slot) {
                out.values[slot] = Some(Kept::Text(value.into_owned()));
            }
        }
        out
    }
}

/// An array index token: decimal digits without a sign or a leading zero (RFC 6901 §4).
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
        return None;
    }
    token.parse().ok()
}

/// Reads one value at `node`: keeps it if a pointer ends here, follows the members and
/// elements that lead to other pointers, skips the rest.
struct Walk<'p, 'o, 'b> {
    node: &'p Node,
    out: &'o mut Extracted,
    /// The document itself, which must be an object.
    top: bool,
    /// The whole body, where unescaped strings are found.
    body: &'b str,
}

impl Walk<'_, '_, '_> {
    fn keep(&mut self, kept: Kept) {
        if let Some(slot) = self.node.slot {
            self.out.values[slot] = Some(kept);
        }
    }

    /// Forgets what an earlier value of the same member left below this node: of repeated
    /// members the last one counts, as in `serde_json::Value`.
    fn forget_below(node: &Node, out: &mut Extracted) {
        for child in &node.children {
            if let Some(slot) = child.node.slot {
                out.values[slot] = None;
            }
            Self::forget_below(&child.node, out);
        }
    }

    fn scalar<E: de::Error>(mut self, kept: Kept) -> Result<(), E> {
        if self.top {
            return Err(E::custom("not an object"));
        }
        self.keep(kept);
        Self::forget_below(self.node, self.out);
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.scalar(Kept::Other)
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<(), E> {
        self.scalar(Kept::Number(n.into()))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<(), E> {
        self.scalar(Kept::Number(n.into()))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<(), E> {
        // serde_json never yields a non-finite number; `Other` is only a fallback.
        let kept = serde_json::Number::from_f64(n).map_or(Kept::Other, Kept::Number);
        self.scalar(kept)
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<(), E> {
        // A string without escapes is a slice of the body: kept as where it is.
        let at = (s.as_ptr() as usize).wrapping_sub(self.body.as_ptr() as usize);
        let in_body = at
            .checked_add(s.len())
            .is_some_and(|end| end <= self.body.len());
        if self.top || self.node.slot.is_none() || !in_body {
            return self.visit_str(s);
        }
        self.scalar(Kept::InBody { at, len: s.len() })
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        // Allocates only for a string with escapes that a pointer names; others are never
        // copied.
        if self.top || self.node.slot.is_none() {
            return self.scalar(Kept::Other);
        }
        self.scalar(Kept::Text(s.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar(Kept::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        if self.top {
            return Err(de::Error::custom("not an object"));
        }
        self.keep(Kept::Other);
        Self::forget_below(self.node, self.out);
        let mut index = 0;
        loop {
            let child = self.node.children.iter().find(|c| c.index == Some(index));
            let more = match child {
                Some(child) => seq
                    .next_element_seed(Walk {
                        node: &child.node,
                        out: &mut *self.out,
                        top: false,
                        body: self.body,
                    })?
                    .is_some(),
                None => seq.next_element_seed(Skip)?.is_some(),
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.keep(Kept::Other);
        Self::forget_below(self.node, self.out);
        while let Some(found) = map.next_key_seed(Member(&self.node.children))? {
            match found {
                Some(child) => map.next_value_seed(Walk {
                    node: &child.node,
                    out: &mut *self.out,
                    top: false,
                    body: self.body,
                })?,
                None => map.next_value_seed(Skip)?,
            }
        }
        Ok(())
    }
}

/// Reads a member name and finds the child it leads to, without copying the name.
struct Member<'p>(&'p [Child]);

impl<'de, 'p> DeserializeSeed<'de> for Member<'p> {
    type Value = Option<&'p Child>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 'p> Visitor<'de> for Member<'p> {
    type Value = Option<&'p Child>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().find(|c| c.token == name))
    }
}

/// Reads and discards a value. Unlike [`IgnoredAny`] it descends through `deserialize_any`,
/// so serde_json's nesting limit still applies (a 10,000-deep array is refused, not walked)
/// and every string is still checked as UTF-8.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn json(body: &[u8]) -> Bytes {
        Bytes::copy_from_slice(body)
    }

    const POINTERS: &[&str] = &[
        "",
        "/id",
        "/data/status",
        "/data",
        "/data/items/0",
        "/data/items/2/x",
        "/data/items/01",
        "/data/items/+1",
        "/data/items/9",
        "/data/missing",
        "/id/deeper",
        "/a~1b",
        "/m~0n",
        "/",
        "/01",
        "/n",
        "/f",
        "/neg",
        "/t",
        "/esc",
        "no-slash",
    ];

    /// Reads `body` with a plan of `pointers` and checks that each value is what
    /// `Value::pointer` finds in the parsed document.
    fn assert_finds_what_value_finds(pointers: &[&str], body: &str) {
        let doc: Value = serde_json::from_str(body).expect("json");
        let mut plan = FieldPlan::default();
        let slots: Vec<Slot> = pointers.iter().map(|p| plan.add(p)).collect();
        let got = plan.extract(&json(body.as_bytes())).expect("object");
        for (pointer, slot) in pointers.iter().zip(slots) {
            let expected = doc.pointer(pointer).map(|v| match v {
                Value::String(s) => Field::Text(s),
                Value::Number(n) => Field::Number(n),
                Value::Null => Field::Null,
                _ => Field::Other,
            });
            assert_eq!(got.get(slot), expected, "{pointer:?} in {body}");
        }
    }

    #[test]
    fn finds_what_value_pointer_finds() {
        let body = r#"{"id":"e1","data":{"status":"sent","items":[10,11,{"x":true}]},
            "a/b":1,"m~n":2,"":3,"01":4,"n":null,"f":-1.5e3,"neg":-7,"t":true,"esc":"a\"b\u00e9"}"#;
        assert_finds_what_value_finds(POINTERS, body);
    }

    #[test]
    fn a_pointer_added_twice_finds_its_value_under_both_slots() {
        let mut plan = FieldPlan::default();
        let first = plan.add("/data/status");
        let other = plan.add("/id");
        let again = plan.add("/data/status");
        let got = plan
            .extract(&json(br#"{"id":"e","data":{"status":"sent"}}"#))
            .expect("object");
        for slot in [first, again] {
            assert_eq!(got.get(slot), Some(Field::Text("sent")));
        }
        assert_eq!(got.get(other), Some(Field::Text("e")));
        let form = plan.extract_form(b"id=f");
        assert_eq!(form.get(other), Some(Field::Text("f")));
        assert_eq!(form.get(again), None);
    }

    #[test]
    fn an_unescaped_string_is_kept_where_it_is_in_the_body_and_an_escaped_one_copied() {
        let mut plan = FieldPlan::default();
        let (plain, escaped, id) = (plan.add("/a"), plan.add("/b"), plan.add("/id"));
        let mut got = plan
            .extract(&json(br#"{"a":"sent","b":"s\u0065nt","id":"e1"}"#))
            .expect("object");
        assert!(matches!(got.values[plain.0], Some(Kept::InBody { .. })));
        assert!(matches!(got.values[escaped.0], Some(Kept::Text(_))));
        assert_eq!(got.get(plain), Some(Field::Text("sent")));
        assert_eq!(got.get(escaped), Some(Field::Text("sent")));
        assert_eq!(got.take_text(id).as_deref(), Some("e1"));
        assert_eq!(got.get(id), None);
    }

    #[test]
    fn a_slot_is_shared_once_a_second_pointer_reads_it_and_taking_empties_it() {
        let mut plan = FieldPlan::default();
        let status = plan.add("/data/status");
        let id = plan.add("/id");
        let count = plan.add("/n");
        assert!(!plan.is_shared(status) && !plan.is_shared(id));
        assert_eq!(plan.add("/data/status"), status);
        assert!(plan.is_shared(status) && !plan.is_shared(id));
        let mut got = plan
            .extract(&json(br#"{"id":"e","n":7,"data":{"status":"sent"}}"#))
            .expect("object");
        assert_eq!(got.take_text(id).as_deref(), Some("e"));
        assert_eq!(got.get(id), None);
        assert_eq!(got.take_text(id), None);
        // Numbers are taken as the text JSON writes them, as `Field::text` gives them.
        assert_eq!(got.take_text(count).as_deref(), Some("7"));
    }
    #[test]
    fn a_repeated_member_counts_once_as_its_last_value() {
        for body in [
            r#"{"data":{"status":"sent","to":"a"},"data":{"to":"b"}}"#,
            r#"{"data":{"status":"sent"},"data":5}"#,
            r#"{"data":{"status":"sent"},"data":[1]}"#,
            r#"{"data":1,"data":{"to":"c"}}"#,
        ] {
            assert_finds_what_value_finds(&["/data/status", "/data/to", "/data"], body);
        }
    }

    #[test]
    fn form_fields_are_read_by_one_token_pointers() {
        let mut plan = FieldPlan::default();
        let pointers = [
            "/MessageSid",
            "/Body",
            "/From",
            "/To",
            "/Missing",
            "",
            "/Body/x",
        ];
        let slots: Vec<Slot> = pointers.iter().map(|p| plan.add(p)).collect();
        let body = b"MessageSid=SM1&Body=Stop%21+now&From=%2B14155550100&To=%2B1&To=%2B2&Other=x";
        let got = plan.extract_form(body);
        let text = |i: usize| got.get(slots[i]).and_then(Field::text).map(Cow::into_owned);
        assert_eq!(text(0).as_deref(), Some("SM1"));
        assert_eq!(
            text(1).as_deref(),
            Some("Stop! now"),
            "+ is a space, %21 a !"
        );
        assert_eq!(text(2).as_deref(), Some("+14155550100"));
        assert_eq!(
            text(3).as_deref(),
            Some("+2"),
            "the last of a repeated field"
        );
        for i in 4..7 {
            assert_eq!(got.get(slots[i]), None, "{}", pointers[i]);
        }
        // Bytes that are not UTF-8 are replaced, never an error.
        let odd = plan.extract_form(b"Body=%FF%FE&MessageSid");
        assert_eq!(
            odd.get(slots[1]).and_then(Field::text).as_deref(),
            Some("\u{FFFD}\u{FFFD}")
        );
        assert_eq!(odd.get(slots[0]).and_then(Field::text).as_deref(), Some(""));
    }

    #[test]
    fn only_a_whole_json_object_is_read() {
        let mut plan = FieldPlan::default();
        plan.add("/id");
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        for body in [
            &b"[1]"[..],
            b"\"s\"",
            b"1",
            b"null",
            b"not json",
            b"",
            b"{\"id\":",
            b"{\"id\":1} x",
            b"{\"id\":\"\xff\"}",
            b"{\"other\":\"\xff\"}",
            deep.as_bytes(),
        ] {
            assert_eq!(
                plan.extract(&json(body)).err(),
                Some(NotAnObject),
                "{:.20}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(plan.extract(&json(br#" {"id": 1} "#)).is_ok());
    }

    #[test]
    fn text_that_is_not_a_pointer_gets_a_slot_of_its_own() {
        let mut plan = FieldPlan::default();
        let not_a_pointer = plan.add("no-slash");
        let id = plan.add("/id");
        assert_ne!(not_a_pointer, id);
        let got = plan.extract(&json(br#"{"id":"e"}"#)).expect("object");
        assert_eq!(got.get(not_a_pointer), None);
        assert_eq!(got.get(id), Some(Field::Text("e")));
    }

    #[test]
    fn members_no_pointer_names_are_skipped_whole() {
        let mut plan = FieldPlan::default();
        let id = plan.add("/id");
        let got = plan
            .extract(&json(
                br#"{"other":[1,[2],{"a":[3]}],"more":{"b":{"c":4},"d":[5]},"id":"e"}"#,
            ))
            .expect("object");
        assert_eq!(got.get(id), Some(Field::Text("e")));
    }
}
