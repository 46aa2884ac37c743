//! What a read-and-change decides for a key.

/// What [`Journal::modify`](super::Journal::modify) does to a key.
pub enum Change<'v> {
    /// Leave it as it is.
    Keep,
    /// Set it; `durable: false` keeps it in memory only (claims).
    Put {
        value: &'v [u8],
        expires_ms: i64,
        durable: bool,
    },
}
