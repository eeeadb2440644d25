//! Counts in the words a person reads: `1 task`, `2 tasks`, `failed once`, `failed 4 times`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
