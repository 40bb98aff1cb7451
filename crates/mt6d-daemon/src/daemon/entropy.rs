//! Randomness from the OS, asked for only when a message needs it.

/// 32 bytes from the OS for one handshake message, asked for only once a message is due or has
/// passed the MAC (a flood of bogus messages costs no syscall). If the OS has none to give, no
/// handshake message is produced.
pub fn entropy() -> Option<[u8; 32]> {
    let mut e = [0u8; 32];
    match getrandom::fill(&mut e) {
        Ok(()) => Some(e),
        Err(err) => {
            log::error!("no randomness from the OS for a handshake: {err}");
            None
        }
    }
}
