//! The value syntax annotations share: Go's booleans, RFC 7230 tokens and
//! whole numbers.

/// Go's `strconv.ParseBool`, which Higress uses for boolean annotations.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// An RFC 7230 token: what header, cookie and method names are made of.
pub fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Digits only (around spaces), as a number; `None` for anything else or
/// more than a u64 holds.
pub fn whole_number(v: &str) -> Option<u64> {
    let t = v.trim();
    let ok = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| t.parse::<u64>().ok()).flatten()
}

/// `count` strings of up to `max_len` pieces of `alphabet`, from a fixed
/// seed (xorshift): input for "never panics" tests, without a property
/// testing dependency.
#[cfg(test)]
pub fn random_inputs<'a>(
    alphabet: &'a [&'a str],
    seed: u64,
    count: usize,
    max_len: u64,
) -> impl Iterator<Item = String> + 'a {
    let mut state = seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count).map(move |_| {
        let len = next() % (max_len + 1);
        (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect()
    })
}
