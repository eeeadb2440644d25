//! The steps the fast readers of the hot messages are made of (`status_updates.rs`,
//! `status_ack.rs`, `launch_tasks.rs`, `groups.rs`): each reads Ember's own form of its message
//! straight from the bytes.
//!
//! serde reads each number of a task through several layers of generic calls; at 64 tasks a
//! message that made decoding the largest cost in an executor's profile and a fifth of the
//! driver's. A fast reader reads only bytes laid out as its message's writer lays them out: the
//! same keys in the same order, no whitespace, integers without sign, fraction, exponent or
//! leading zero, strings of printable ASCII without escapes, and objects inside (a spec, a
//! status with a result) that nest shallowly, which serde reads. At the first byte that
//! differs it gives up, and `decode` reads the message with serde as before. So a fast reader
//! can only produce what serde produces from the same bytes, and every refusal, with its error
//! text, still comes from serde. tests/fuzz_decoders.rs holds the two together on mutated
//! messages.

use serde::de::value::{BorrowedStrDeserializer, Error};
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// An object inside a message that nests deeper than this is left to serde, which alone knows
/// how deep the whole message nests (it refuses past 128).
pub(super) const EMBEDDED_DEPTH: usize = 64;

/// Where a fast reader has got to: the bytes not read yet.
pub(super) struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    pub(super) fn new(payload: &'a [u8]) -> Self {
        Cursor(payload)
    }

    /// Reads `literal`, or gives up.
    pub(super) fn eat(&mut self, literal: &[u8]) -> Option<()> {
        self.0 = self.0.strip_prefix(literal)?;
        Some(())
    }

    /// Reads `byte` if it comes next.
    fn eat_if(&mut self, byte: u8) -> bool {
        self.eat(&[byte]).is_some()
    }

    /// `{"type":"tag"`: the start of a message.
    pub(super) fn open(&mut self, tag: &str) -> Option<()> {
        self.eat(br#"{"type":""#)?;
        self.eat(tag.as_bytes())?;
        self.eat(b"\"")
    }

    /// `{"key":`: the start of an object and its first key.
    pub(super) fn first(&mut self, key: &str) -> Option<()> {
        self.eat(b"{")?;
        self.quoted_key(key)
    }

    /// `,"key":`: the next key of an object.
    pub(super) fn key(&mut self, key: &str) -> Option<()> {
        self.eat(b",")?;
        self.quoted_key(key)
    }

    fn quoted_key(&mut self, key: &str) -> Option<()> {
        self.eat(b"\"")?;
        self.eat(key.as_bytes())?;
        self.eat(b"\":")
    }

    /// `,"key":` and its value, read by `read`, if that key comes next. `None` gives up;
    /// `Some(None)` means absent.
    pub(super) fn optional<T>(
        &mut self,
        key: &str,
        read: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<Option<T>> {
        let before = self.0;
        if self.key(key).is_none() {
            self.0 = before;
            return Some(None);
        }
        read(self).map(Some)
    }

    /// The `}` that ends an object.
    pub(super) fn end_object(&mut self) -> Option<()> {
        self.eat(b"}")
    }

    /// The closing `}` of the message, which must end there.
    pub(super) fn close(&mut self) -> Option<()> {
        self.end_object()?;
        self.0.is_empty().then_some(())
    }

    /// A non-negative integer as JSON writes it: `0`, or digits that do not start with `0`.
    /// Gives up on overflow; what follows is for the caller to check.
    pub(super) fn u64(&mut self) -> Option<u64> {
        let digit = |b: &u8| b.is_ascii_digit().then(|| u64::from(b - b'0'));
        let (first, mut rest) = self.0.split_first()?;
        let mut n = digit(first)?;
        if n != 0 {
            while let Some(d) = rest.first().and_then(digit) {
                n = n.checked_mul(10)?.checked_add(d)?;
                rest = &rest[1..];
            }
        }
        self.0 = rest;
        Some(n)
    }

    pub(super) fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    /// A string of printable ASCII without escapes, read as serde reads a string into a `T`.
    pub(super) fn string<T: Deserialize<'a>>(&mut self) -> Option<T> {
        self.eat(b"\"")?;
        let len = self.0.iter().position(|&b| b == b'"')?;
        let (text, rest) = self.0.split_at(len);
        if !text
            .iter()
            .all(|&b| (b' '..=b'~').contains(&b) && b != b'\\')
        {
            return None;
        }
        let text = std::str::from_utf8(text).ok()?;
        self.0 = &rest[1..];
        T::deserialize(BorrowedStrDeserializer::<Error>::new(text)).ok()
    }

    /// `[`, then what [`Cursor::items`] reads, or nothing.
    pub(super) fn list(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b"[")?;
        match self.eat_if(b']') {
            true => Some(()),
            false => self.items(item),
        }
    }

    /// Items separated by commas, at least one, each read by `item`, then `]`.
    pub(super) fn items(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        loop {
            item(self)?;
            if self.eat_if(b']') {
                return Some(());
            }
            self.eat(b",")?;
        }
    }

    /// `[a,b,..]`: exactly `N` integers.
    pub(super) fn numbers<const N: usize>(&mut self) -> Option<[u64; N]> {
        self.eat(b"[")?;
        let mut numbers = [0; N];
        for (i, n) in numbers.iter_mut().enumerate() {
            if i > 0 {
                self.eat(b",")?;
            }
            *n = self.u64()?;
        }
        self.eat(b"]")?;
        Some(numbers)
    }

    /// Whether an object starts here.
    pub(super) fn at_object(&self) -> bool {
        self.0.first() == Some(&b'{')
    }

    /// An object read by serde as a `T`, that must start right here and nest shallowly.
    pub(super) fn embedded<T: DeserializeOwned>(&mut self) -> Option<T> {
        if !self.at_object() {
            return None;
        }
        let mut objects = serde_json::Deserializer::from_slice(self.0).into_iter::<T>();
        let object = objects.next()?.ok()?;
        let (read, rest) = self.0.split_at(objects.byte_offset());
        if depth(read) > EMBEDDED_DEPTH {
            return None;
        }
        self.0 = rest;
        Some(object)
    }
}

/// How deeply `json`, a JSON text, nests: the most `[` and `{` open at once.
fn depth(json: &[u8]) -> usize {
    let (mut open, mut deepest) = (0usize, 0);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        match (in_string, b) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') => in_string = false,
            (true, _) => {}
            (false, b'"') => in_string = true,
            (false, b'[' | b'{') => {
                open += 1;
                deepest = deepest.max(open);
            }
            (false, b']' | b'}') => open = open.saturating_sub(1),
            (false, _) => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn depth_counts_what_is_open_at_once_outside_strings() {
        for (text, expected) in [
            ("1", 0),
            ("[]", 1),
            ("[[],[],{}]", 2),
            (r#"{"a":[{"b":[1]}]}"#, 4),
            (r#"{"a":"[[[[{{"}"#, 1),
            (r#"{"a":"\"[[","b":[]}"#, 2),
            (r#"["\\",[1]]"#, 2),
        ] {
            assert_eq!(depth(text.as_bytes()), expected, "{text}");
        }
    }

    #[test]
    fn an_embedded_object_is_read_where_it_starts_and_no_further() {
        let mut c = Cursor::new(br#"{"a":[1,{"b":null}]},"next""#);
        assert_eq!(c.embedded::<Value>(), Some(json!({"a": [1, {"b": null}]})));
        assert_eq!(c.0, br#","next""#);
        assert_eq!(Cursor::new(b"[1]").embedded::<Value>(), None);
        assert_eq!(Cursor::new(br#" {"a":1}"#).embedded::<Value>(), None);
    }

    #[test]
    fn an_object_that_nests_deeply_is_left_to_serde() {
        let mut value = json!(1);
        for _ in 0..EMBEDDED_DEPTH {
            value = json!([value]);
        }
        let shallow = serde_json::to_vec(&json!({ "a": value })).unwrap();
        assert_eq!(depth(&shallow), EMBEDDED_DEPTH + 1);
        assert_eq!(Cursor::new(&shallow).embedded::<Value>(), None);
        let mut wide = Vec::from(&b"{\"a\":["[..]);
        wide.extend(vec!["[]"; 1000].join(",").bytes());
        wide.extend(b"]}");
        assert!(Cursor::new(&wide).embedded::<Value>().is_some());
    }

    #[test]
    fn an_optional_key_that_is_not_next_leaves_the_cursor_where_it_was() {
        let mut c = Cursor::new(br#","other":1}"#);
        assert_eq!(c.optional("key", Cursor::u64), Some(None));
        assert_eq!(c.0, br#","other":1}"#);
        let mut c = Cursor::new(br#","key":7}"#);
        assert_eq!(c.optional("key", Cursor::u64), Some(Some(7)));
        let mut c = Cursor::new(br#","key":"x"}"#);
        assert_eq!(c.optional("key", Cursor::u64), None);
    }
}
