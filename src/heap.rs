//! The allocator's slack between simulations.
//!
//! glibc's malloc gives the top of its heap back to the kernel whenever more
//! than its trim threshold (128 KiB) is free there. A process that runs
//! simulation after simulation (a sweep, replicas, the benchmarks) then
//! takes the same pages back with a fault each on every run, or not,
//! depending on where the last run's frees happened to fall: between two
//! builds of the end-to-end GLM benchmark whose instructions were within
//! 1 %, a quarter of the run's time went from nothing to page faults.
//! [`keep_slack`] keeps 16 MiB at the top instead, so that the time of a
//! run does not depend on that. (Pages never touched cost no memory.)

/// Keeps 16 MiB of free heap at the top rather than returning it (glibc's
/// `M_TOP_PAD`); elsewhere, nothing.
pub fn keep_slack() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets one of glibc's allocator parameters under the
    // allocator's own lock; it touches no memory of ours.
    unsafe {
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
}
