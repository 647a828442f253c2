//! Seeded per-actor random streams.
//!
//! One scenario seed keys a ChaCha8 generator; each actor reads its own
//! ChaCha *stream* (a 64-bit stream id derived from the actor's stable key,
//! its name). Streams of one key are independent sequences, so adding,
//! removing or reordering actors never shifts the numbers another actor
//! draws, and nothing here depends on the machine, the Rust version or a
//! hash map's iteration order.

use rand::SeedableRng;
pub use rand_chacha::ChaCha8Rng as ActorRng;

/// FNV-1a, 64 bits: a stable hash of an actor's key (unlike `std`'s
/// `DefaultHasher`, whose output may change between Rust releases).
pub const fn stable_key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < key.len() {
        h ^= key[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// The random stream of the actor named `key` in a run seeded with `seed`.
///
/// ```
/// use rand::Rng;
/// let mut a = sim_core::rng::stream_for(7, "arrivals");
/// let mut b = sim_core::rng::stream_for(7, "arrivals");
/// assert_eq!(a.random::<u64>(), b.random::<u64>());
/// ```
pub fn stream_for(seed: u64, key: &str) -> ActorRng {
    let mut rng = ActorRng::seed_from_u64(seed);
    rng.set_stream(stable_key_hash(key.as_bytes()));
    rng
}
