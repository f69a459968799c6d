//! Keeping the process's resident memory close to what it uses.
//!
//! glibc's malloc gives each thread that allocates its own arena (up to 8
//! per core) and returns freed memory to the kernel only from the top of
//! each heap. A server that ingests a burst on many threads (tokio workers,
//! the blocking pool, RocksDB, librdkafka) keeps that high-water mark as
//! resident memory long after the burst. Two arenas and a periodic trim keep
//! resident memory near the working set. Elsewhere these are no-ops.
//!
//! This concerns a program that uses the library with glibc's malloc: on
//! Linux, the `hourglass` binary serves every allocation, RocksDB's and
//! librdkafka's too, with jemalloc, which purges in the background; these
//! calls then reach a malloc nothing uses.

/// jemalloc's settings for a binary that serves every allocation with it
/// (see [`jemalloc!`]): purge in
/// the background, dirty pages after 1 s, no muzzy stage; two arenas and
/// thread caches of small objects only, which keep a server at rest about
/// 2 MiB smaller than the defaults and the drain as fast. `MALLOC_CONF`
/// in the environment adds to them.
pub const JEMALLOC_CONF: &[u8] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:2,tcache_max:1024\0";

/// Serves every allocation of the binary that invokes it (once, at the top
/// level of its crate) with jemalloc, started with [`JEMALLOC_CONF`]. On
/// Linux that includes RocksDB's and librdkafka's allocations, which glibc's
/// malloc served with its arenas' locks: a quarter of the drain's rate went
/// there. jemalloc's background thread hands freed memory back to the
/// system within about a second, so a server at rest holds little; the
/// glibc calls below are then not needed.
#[macro_export]
#[doc(hidden)]
macro_rules! __jemalloc {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::memory::Jemalloc = $crate::memory::Jemalloc;

        /// jemalloc's settings, read when it starts (the name jemalloc
        /// reads: prefixed where its symbols are kept prefixed).
        #[allow(non_upper_case_globals)]
        #[cfg_attr(
            not(any(target_os = "android", target_os = "dragonfly", target_vendor = "apple")),
            unsafe(export_name = "malloc_conf")
        )]
        #[cfg_attr(
            any(target_os = "android", target_os = "dragonfly", target_vendor = "apple"),
            unsafe(export_name = "_rjem_malloc_conf")
        )]
        pub static malloc_conf: &[u8] = $crate::memory::JEMALLOC_CONF;
    };
}

#[doc(inline)]
pub use crate::__jemalloc as jemalloc;
#[doc(hidden)]
pub use tikv_jemallocator::Jemalloc;

/// Caps glibc's malloc arenas. Call once, early, before threads start.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns free heap memory to the kernel.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe and only releases free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}
