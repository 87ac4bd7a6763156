//! After start-up, give back the memory only start-up needed, so an idle devplug is small.
//!
//! Loading backends touches megabytes that the idle loop never reads again: the embedded
//! components and their precompiled code in the binary's read-only data (copied into the
//! engine's own executable memory when deserialized), and the code of start-up paths (engine
//! set-up, registration). Those clean pages of the binary stay resident, and charged to the
//! pod's memory cgroup, until the kernel needs memory. `MADV_PAGEOUT` reclaims them now; a page
//! needed later (the health poll's code) faults back in once from the page cache or disk. glibc
//! also keeps the heap that start-up freed; `malloc_trim` returns it. Measured in
//! docs/BENCHMARKS.md ("Start and idle memory").

/// Keep large blocks out of glibc's arenas, so memory freed after a backend's flood goes back to
/// the kernel. glibc raises its mmap threshold (up to 32 MiB) each time an mmapped block is
/// freed; from then on blocks that size come from per-thread arenas and stay with the process
/// after `free` (a backend sending 16 MiB paths left +180–245 MiB behind, one arena per blocking
/// thread). Setting the threshold fixes it (no more dynamic raising): every block of 1 MiB or
/// more is its own mapping, unmapped when freed. Call once, first thing in `main`.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; called before any thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Page out the binary's clean mappings and trim the heap. Best effort: failures are logged at
/// debug level and change nothing else.
pub(crate) fn after_start() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory back to the kernel; it touches no live
    // allocation.
    unsafe {
        libc::malloc_trim(0);
    }
    let paged = page_out_binary();
    tracing::debug!(kib = paged / 1024, "paged out the binary's start-up pages");
}

/// `MADV_PAGEOUT` over every read-only mapping of our own executable; the bytes advised.
fn page_out_binary() -> usize {
    let (Ok(exe), Ok(maps)) = (std::fs::read_link("/proc/self/exe"), std::fs::read_to_string("/proc/self/maps")) else {
        return 0;
    };
    let exe = exe.to_string_lossy().into_owned();
    let mut total = 0;
    for (start, len) in maps.lines().filter_map(|l| readonly_mapping_of(l, &exe)) {
        let Some(addr) = std::ptr::NonNull::new(start as *mut std::ffi::c_void) else { continue };
        // SAFETY: the range is a whole mapping of our binary that is not writable: paging it out
        // drops clean page-cache pages, which the kernel faults back in on the next access. No
        // Rust object's contents change.
        let r = unsafe { nix::sys::mman::madvise(addr, len, nix::sys::mman::MmapAdvise::MADV_PAGEOUT) };
        match r {
            Ok(()) => total += len,
            Err(e) => tracing::debug!(start, len, "MADV_PAGEOUT: {e}"),
        }
    }
    total
}

/// (start, length) of a `/proc/self/maps` line that maps `exe` without write permission.
fn readonly_mapping_of(line: &str, exe: &str) -> Option<(usize, usize)> {
    let mut f = line.split_whitespace();
    let range = f.next()?;
    let perms = f.next()?;
    let path = f.nth(3)?;
    if path != exe || perms.contains('w') {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
    (b > a).then_some((a, b - a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_read_only_mappings_are_chosen() {
        let exe = "/usr/bin/devplug";
        let line = |s: &str| readonly_mapping_of(s, exe);
        assert_eq!(
            line("55d0a0000000-55d0a0400000 r-xp 00001000 08:01 1234 /usr/bin/devplug"),
            Some((0x55d0a0000000, 0x400000))
        );
        assert_eq!(
            line("55d0a0400000-55d0a0600000 r--p 00401000 08:01 1234 /usr/bin/devplug"),
            Some((0x55d0a0400000, 0x200000))
        );
        assert_eq!(line("55d0a0600000-55d0a0610000 rw-p 00601000 08:01 1234 /usr/bin/devplug"), None, "data stays");
        assert_eq!(line("7f0000000000-7f0000100000 r-xp 00000000 08:01 99 /usr/lib/libc.so.6"), None);
        assert_eq!(line("7f0000000000-7f0000100000 rw-p 00000000 00:00 0"), None, "anonymous");
    }

    #[test]
    fn trimming_a_running_process_keeps_it_running() {
        after_start();
        // Code and read-only data come back on use.
        let v: Vec<u64> = (0..1000).collect();
        assert_eq!(v.iter().sum::<u64>(), 499_500);
        assert!(format!("{:?}", std::env::current_exe()).contains('/'));
    }
}
