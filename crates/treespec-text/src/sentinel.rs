//! The guard's sentinels: private-use characters that stand in a rendered chat for strings of a
//! message that would read as special tokens ([`crate::guard`]). Their own file because both the
//! guard and `tojson` (which must leave them as they are) read them.

/// The first sentinel code point (plane 15 private use area, U+F0000–U+FFFFD).
pub(crate) const SENTINEL_BASE: u32 = 0xF_0000;
/// How many sentinels there are (and so how many swapped strings one request may hold).
pub(crate) const SENTINELS: u32 = 0xF_FFFE - SENTINEL_BASE;

/// Whether `c` is one of the sentinels.
pub(crate) fn is_sentinel(c: char) -> bool {
    (SENTINEL_BASE..SENTINEL_BASE + SENTINELS).contains(&(c as u32))
}
