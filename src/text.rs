//! Text a person reads: counts in words (`1 task`, `2 tasks`, `failed once`, `failed 4 times`),
//! times, and long text cut to a size that fits where it goes, saying it was cut.

use std::borrow::Cow;

/// The most bytes of a task's error text that a status, a journal record or an event carries.
/// A task's whole output stays in its result; the error says why it failed, in a line or two.
pub const MAX_ERROR_BYTES: usize = 4096;

/// Epoch milliseconds as an RFC 3339 time (UTC, to the second).
pub fn format_time(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `n` and the noun, singular for one: `count(1, "task", "tasks")` is `1 task`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    match n.into() {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// How many times something happened: `once`, `twice`, `3 times`.
pub fn times(n: impl Into<u64>) -> String {
    match n.into() {
        1 => "once".into(),
        2 => "twice".into(),
        n => format!("{n} times"),
    }
}

/// The cap on a task's error text where messages may be at most `limit` bytes:
/// [`MAX_ERROR_BYTES`], or a quarter of `limit` if that is less, so that the error and what
/// goes around it (ids, a job's reason, a record's framing) fit in one message.
pub fn error_cap(limit: usize) -> usize {
    MAX_ERROR_BYTES.min(limit / 4)
}

/// `text` if it is at most `max` bytes; otherwise its start, cut at a character boundary,
/// and a note that it was cut and how long it was, `max` bytes in all.
pub fn clip(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let note = format!(" [cut: {} bytes in all]", text.len());
    let end = floor_char_boundary(text, max.saturating_sub(note.len()));
    if end == 0 {
        // Too small a cap for the note: the start alone.
        return Cow::Owned(text[..floor_char_boundary(text, max)].to_string());
    }
    Cow::Owned(format!("{}{note}", &text[..end]))
}

/// The largest character boundary of `text` at or before `index` (at most its length), as
/// `str::floor_char_boundary` does on Rust newer than this crate's minimum.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut end = index.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// [`clip`] for an error text that is owned already: kept as it is when it fits.
pub fn clip_owned(text: String, max: usize) -> String {
    match clip(&text, max) {
        Cow::Borrowed(_) => text,
        Cow::Owned(cut) => cut,
    }
}

/// A name or key a client picks (`what`, say "pool name"): 1 to `max` bytes of letters,
/// digits, `_`, `-` and `.`.
pub fn validate_key(what: &str, name: &str, max: usize) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("a {what} may not be empty"));
    }
    if name.len() > max {
        return Err(format!(
            "{what} {:?} is longer than {max} bytes",
            clip(name, 32)
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "{what} {name:?} has {c:?}: use letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipped_text_fits_keeps_whole_characters_and_says_it_was_cut() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("exactly10!", 10), "exactly10!");
        let long = "x".repeat(100);
        let cut = clip(&long, 40);
        assert_eq!(cut, format!("{} [cut: 100 bytes in all]", "x".repeat(16)));
        assert_eq!(cut.len(), 40);
        // Two-byte characters: the cut never splits one.
        let wide = "é".repeat(100);
        for max in 30..60 {
            let cut = clip(&wide, max);
            assert!(cut.len() <= max, "{max}: {cut}");
            assert!(cut.starts_with('é') && cut.ends_with("[cut: 200 bytes in all]"));
        }
        // A cap too small for the note keeps what fits of the start.
        assert_eq!(clip(&wide, 5), "éé");
        assert_eq!(clip_owned(long.clone(), 100), long);
        assert_eq!(error_cap(1 << 20), MAX_ERROR_BYTES);
        assert_eq!(error_cap(4096), 1024);
    }

    #[test]
    fn one_is_singular_and_the_rest_plural() {
        assert_eq!(count(1u32, "task", "tasks"), "1 task");
        assert_eq!(count(0u32, "task", "tasks"), "0 tasks");
        assert_eq!(count(5u32, "task", "tasks"), "5 tasks");
        assert_eq!(times(1u32), "once");
        assert_eq!(times(2u32), "twice");
        assert_eq!(times(4u32), "4 times");
    }
}
