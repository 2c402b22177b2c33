//! Subnormal floats flushed to zero on the CPU (x86-64: the FTZ and DAZ bits of MXCSR).
//!
//! An x86 core computes with a subnormal input or result (magnitude below about 1.2e-38)
//! through a slow microcode path. Training produces them as it goes (which tensors hold them
//! was not measured; probabilities that underflow as attention sharpens are one likely
//! source, and the section checkpoints held none): measured on the 2-core Intel Xeon,
//! `iota local --preset small --sections 2` (1 miner per section, 220 samples) ran at about
//! 3.5 samples/s for its first ~75 samples and about 2.3 after, the head miner's compute per
//! sample up 1.5x; with these bits set it kept about 3.4 samples/s to the end (220 samples in
//! 75 s against 91). Values that small are below anything a bf16 or f32 weight update can
//! change, and PyTorch users set the same bits on CPUs (`torch.set_flush_denormal`). GPUs do
//! not read these bits.

/// Environment variable that leaves subnormals as they are (for comparing numerics).
pub const KEEP_VAR: &str = "IOTA_KEEP_SUBNORMALS";

/// Sets flush-to-zero and denormals-are-zero for this thread and every thread it starts
/// afterwards (a new thread inherits the floating-point control state), unless
/// [`KEEP_VAR`] is set. Call it first in `main`, before any thread starts. Elsewhere than
/// x86-64 it does nothing.
pub fn flush() {
    if std::env::var_os(KEEP_VAR).is_some() {
        return;
    }
    set_flush();
}

fn set_flush() {
    #[cfg(target_arch = "x86_64")]
    {
        // Bit 15: flush results to zero; bit 6: read subnormal inputs as zero.
        const FTZ_DAZ: u32 = 0x8040;
        // SAFETY: only this thread's floating-point control word changes; SSE is part of
        // x86-64. The intrinsics are deprecated in favour of inline assembly for the rounding
        // mode, whose changes the compiler may not see; flushing subnormals is a mode the
        // program's results are meant to follow from here on.
        #[allow(deprecated)]
        unsafe {
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            _mm_setcsr(_mm_getcsr() | FTZ_DAZ);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// Half of the smallest normal f32: subnormal unless flushed.
    fn halved_min() -> f32 {
        black_box(f32::MIN_POSITIVE) * black_box(0.5)
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_flushed_thread_and_the_threads_it_starts_give_zero_for_subnormals() {
        // A thread of its own, so the test harness's threads keep their mode.
        let (here, child, other) = std::thread::spawn(|| {
            set_flush();
            let here = halved_min();
            let child = std::thread::spawn(halved_min).join().unwrap();
            (
                here,
                child,
                std::thread::spawn(|| black_box(1e-39f32) + 0.0).join(),
            )
        })
        .join()
        .unwrap();
        assert_eq!(here, 0.0);
        assert_eq!(child, 0.0, "a thread started afterwards inherits the mode");
        assert_eq!(other.unwrap(), 0.0, "a subnormal input reads as zero");
        // A thread that did not set it keeps subnormals.
        let plain = std::thread::spawn(halved_min).join().unwrap();
        assert!(plain > 0.0 && !plain.is_normal(), "{plain}");
    }
}
