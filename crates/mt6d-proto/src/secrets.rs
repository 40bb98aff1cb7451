//! Clearing what key handling leaves behind on the stack.
//!
//! Building a key schedule or running a Noise message in `ring` and `snow` leaves copies of keys
//! and chaining values in the stack frames of the calls that did it; neither crate clears them.
//! Once those calls have returned, the same stack region lies below the caller's frame, where the
//! next call's frame will be: [`scrub_stack`] is that call, and it writes zeros over the region.
//! It runs once per handshake message and per key installation, never per packet.

/// Bytes of stack cleared. The frames of a Noise message (X25519, BLAKE2s HMAC, ChaCha20-Poly1305)
/// and of an AES or ChaCha20 key set-up take a few KiB; this is several times that. Best effort:
/// frames deeper than this, or copies a compiler keeps in registers spilled elsewhere, are not
/// reached, and this cannot be checked without reading memory outside any live object.
pub(crate) const SCRUB_BYTES: usize = 16 * 1024;

/// Writes zeros over the [`SCRUB_BYTES`] of stack below the caller's frame.
#[inline(never)]
pub(crate) fn scrub_stack() {
    let mut area = [0u8; SCRUB_BYTES];
    // The zeros must reach memory even though nothing reads them.
    std::hint::black_box(&mut area);
}
