//! Cache keys: the 64-bit names of cached content, and how a key says
//! whether it is one of a group. The request layer makes them (a prefix
//! id's blocks, [`crate::requests::workload::PrefixIds`]); the KV cache's key
//! map stores them (`kv::keymap`), grouped keys a group to a cell.

/// A 64-bit mixer (splitmix64's finaliser) over an id and a position.
pub fn mix(id: u64, pos: u64) -> u64 {
    let mut z = id ^ pos.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Keys with this bit set are grouped: the key without its low
/// [`PLACE_BITS`] bits names a group of up to [`GROUP_LEN`] keys, which
/// share one cell and one record holding their slots, and those bits are
/// its place in the group. A run of blocks whose keys share a group (the
/// blocks of one prefix id) is looked up, registered and evicted through
/// one cell instead of one a block. Which keys are grouped is the caller's
/// choice ([`grouped_key`], [`plain_key`]); any key is valid either way.
pub(crate) const GROUPED: u64 = 1 << 63;

/// Bits of a grouped key's place in its group.
pub(crate) const PLACE_BITS: u32 = 5;

/// Keys a group holds.
pub(crate) const GROUP_LEN: usize = 1 << PLACE_BITS;

/// The grouped key of place `place` in the group `group` names (a hash).
#[inline]
pub(crate) fn grouped_key(group: u64, place: u64) -> u64 {
    debug_assert!(place < GROUP_LEN as u64);
    GROUPED | (group >> (PLACE_BITS + 1) << PLACE_BITS) | place
}

/// `k` as a key of its own (not grouped).
#[inline]
pub(crate) fn plain_key(k: u64) -> u64 {
    k & !GROUPED
}
