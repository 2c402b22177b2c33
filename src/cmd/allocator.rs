//! How the C allocator hands out large buffers (glibc on Linux).
//!
//! A merge moves a section's whole state several times (its upload, the sources and results of
//! its partitions, the checkpoint), in buffers of megabytes that live for a fraction of a
//! second. glibc serves such a buffer with its own `mmap` once it is larger than a threshold
//! that starts at 128 KiB and follows the largest buffer freed, and gives a heap's free top
//! back to the kernel beyond twice that threshold. So each merge mapped, zero-filled, faulted
//! in and unmapped tens of megabytes again: measured with `perf` over `iota local` (tiny, 3 x 2
//! miners, merges every 20 samples), page faults and page clearing were about a sixth of a
//! merge's CPU. Raising the threshold to its maximum (32 MiB) and keeping up to 1 GiB of freed
//! heap for reuse cut the merge phase by about 16% there ([`tune`]); buffers larger than
//! 32 MiB are still mapped and unmapped each time.
//!
//! The orchestrator does not take this ([`super::Command::tunes_allocator`]): it moves small
//! buffers, runs for weeks, and with freed heap kept its RSS climbed through a run.

/// Largest buffer served from the heap (glibc's maximum for the threshold on 64-bit).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free heap kept for reuse before its top is given back to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Sets the allocator's thresholds (see the module docs) unless `GLIBC_TUNABLES` already
/// sets malloc parameters, which are then left as the user chose. Call it first, before
/// threads start. Elsewhere than glibc it does nothing.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let user_set = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
        if !user_set {
            // SAFETY: mallopt only changes the allocator's parameters; it is called before
            // any other thread exists, and a refused value (return 0) leaves the default.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
            }
        }
    }
}
