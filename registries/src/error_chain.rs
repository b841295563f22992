//! Walking an error's chain of causes, once for the whole crate.

use std::error::Error;

/// `e` and then each of its causes, outermost first.
pub fn causes<'a>(e: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |&e| e.source())
}

/// `e` and its causes on one line, joined by `": "`.
pub fn error_chain(e: &(dyn Error + 'static)) -> String {
    let mut text = String::new();
    for (i, cause) in causes(e).enumerate() {
        if i > 0 {
            text.push_str(": ");
        }
        text.push_str(&cause.to_string());
    }
    text
}

/// The first `T` in `e`'s chain, looking inside `io::Error`s too (an
/// `io::Error` hides the error it wraps from `source()`).
pub fn find<'a, T: Error + 'static>(e: &'a (dyn Error + 'static)) -> Option<&'a T> {
    for cause in causes(e) {
        if let Some(t) = cause.downcast_ref::<T>() {
            return Some(t);
        }
        let mut io = cause.downcast_ref::<std::io::Error>();
        while let Some(inner) = io.and_then(std::io::Error::get_ref) {
            if let Some(t) = inner.downcast_ref::<T>() {
                return Some(t);
            }
            io = inner.downcast_ref::<std::io::Error>();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("innermost")]
    struct Innermost;

    #[test]
    fn joins_the_chain_and_finds_inside_io_errors() {
        let e = Outer(std::io::Error::other(Innermost));
        assert_eq!(error_chain(&e), "outer: innermost");
        assert_eq!(causes(&e).count(), 2);
        assert!(find::<Innermost>(&e).is_some());
        assert!(find::<std::io::Error>(&e).is_some());
        assert!(find::<std::fmt::Error>(&e).is_none());
    }
}
