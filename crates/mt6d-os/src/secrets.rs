//! Keeping key material out of core dumps and away from other processes of the same user: the
//! process marks itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`: no core file, no ptrace attach
//! by an unprivileged process of the same uid, /proc/PID/mem closed to it), and the pages that hold
//! long-lived keys are excluded from any dump that is taken anyway (`madvise(MADV_DONTDUMP)`, for
//! a system configured with `suid_dumpable = 2` or a dump taken by root).
//!
//! This is one of the modules allowed to hold `unsafe`; each block states why it is sound.

use std::io;
use std::mem;

use crate::sys::cvt;

/// Marks this process non-dumpable (`prctl(2)` `PR_SET_DUMPABLE` 0). Idempotent. Inherited by
/// threads; reset by `execve` of another program only.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes integer arguments only; no memory is read or written.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) })?;
    Ok(())
}

/// Whether this process is dumpable (`prctl(2)` `PR_GET_DUMPABLE`).
pub fn is_dumpable() -> io::Result<bool> {
    // SAFETY: PR_GET_DUMPABLE takes no pointer; it returns the flag.
    let r = cvt(unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) })?;
    Ok(r != 0)
}

/// Excludes the pages holding `value` (its inline bytes, not what it points to) from core dumps
/// (`madvise(2)` `MADV_DONTDUMP`). Whole pages are affected: neighbours on the same pages are left
/// out of dumps too, which costs nothing but debugging detail. Idempotent.
pub fn dont_dump<T: ?Sized>(value: &T) -> io::Result<()> {
    dont_dump_range(
        (value as *const T).cast::<u8>() as usize,
        mem::size_of_val(value),
    )
}

fn dont_dump_range(addr: usize, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let page = page_size();
    let start = addr & !(page - 1);
    let end = (addr + len).div_ceil(page) * page;
    // SAFETY: madvise(2) with MADV_DONTDUMP only changes a flag of the mappings covering
    // [start, end); it neither reads nor writes their contents. The range lies within mappings
    // of this process (it covers a live object, rounded out to whole pages of the same mapping
    // or its neighbours; an unmapped part fails with ENOMEM and changes nothing there).
    cvt(unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTDUMP) })?;
    Ok(())
}

fn page_size() -> usize {
    // SAFETY: sysconf takes an integer and reads no memory.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    // Linux always reports a positive power of two; fall back to 4 KiB if it ever did not.
    usize::try_from(n)
        .ok()
        .filter(|n| n.is_power_of_two())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_becomes_non_dumpable() {
        set_non_dumpable().expect("must succeed");
        assert!(!is_dumpable().expect("must succeed"));
        set_non_dumpable().expect("must succeed");
    }

    #[test]
    fn key_pages_are_marked() {
        let key = Box::new([0x5au8; 32]);
        dont_dump(&*key).expect("must succeed");
        let v = vec![1u8; 10_000];
        dont_dump(&v[..]).expect("must succeed");
        dont_dump(&[0u8; 0][..]).expect("must succeed");
        // Visible in /proc/self/smaps as the "dd" VmFlag of the mapping.
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("must succeed");
        assert!(smaps.contains(" dd"), "no mapping marked dd");
    }
}
