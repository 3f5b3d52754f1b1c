//! The fiber stacks the guests' async calls run on (SPEC §6), for the on-demand allocator:
//! each mapped once, with a guard page, and kept for the next instance when its store is
//! dropped, so that starting an instance maps no stack under the process's mmap lock.
//!
//! wasmtime's own on-demand stacks cost an `mmap` and an `mprotect` per instance and a
//! `munmap` per dropped store, each taking the process's mmap lock for writing; with 100
//! services started at once the two worker threads queue on it (a third of the time spent
//! instantiating, by `perf`; see BENCHMARKS.md). wasmtime's pooling allocator reuses stacks
//! but pools the memories and tables too, which costs more memory per idle service. The
//! pool here keeps only stacks, and only up to a bound, with at most [`KEEP_RESIDENT`] of
//! each one's pages kept resident.

use std::ffi::c_void;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use rustix::mm::{Advice, MapFlags, MprotectFlags, ProtFlags};
use wasmtime::{StackCreator, StackMemory};

/// How many unused stacks the pool keeps. A host starting more services than this at once
/// maps the others as wasmtime would, and unmaps them when they stop.
pub(crate) const CACHED_STACKS: usize = 256;

/// The bytes at the top of a returned stack (where a fiber's frames begin) that stay
/// resident for the next instance; the pages below are given back to the kernel, so an idle
/// pool holds at most [`CACHED_STACKS`] × this (16 MiB), whatever depth a guest reached.
pub(crate) const KEEP_RESIDENT: usize = 64 << 10;

/// Hands wasmtime stacks from a bounded cache of mappings, or new mappings when it is empty.
pub(crate) struct StackPool {
    cache: Arc<Cache>,
}

impl StackPool {
    /// A pool that keeps at most `bound` unused stacks.
    pub(crate) fn new(bound: usize) -> Self {
        Self {
            cache: Arc::new(Cache {
                bound,
                free: Mutex::new(Vec::new()),
            }),
        }
    }

    /// How many unused stacks the pool holds now.
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.lock().len()
    }
}

/// The unused stacks of a pool; shared with every stack handed out, which comes back on drop.
struct Cache {
    bound: usize,
    /// Most recently returned last: reused first, its top pages still warm.
    free: Mutex<Vec<Mapping>>,
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Mapping>> {
        // Pushes and pops are single operations: a poisoned lock still holds a valid list.
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `mapping` for reuse if there is room (without its cold pages), else unmaps it.
    fn put(&self, mapping: Mapping) {
        // The madvise runs outside the lock: it takes the mmap lock, and others may pop.
        let room = self.lock().len() < self.bound;
        // An error is never expected (a range of our own mapping); unmapping is always safe.
        if room && mapping.discard_below(KEEP_RESIDENT).is_ok() {
            let mut free = self.lock();
            if free.len() < self.bound {
                free.push(mapping);
                return;
            }
        }
        mapping.unmap();
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // The last stack handed out is back (each holds the cache): none is in use.
        for mapping in self.lock().drain(..) {
            mapping.unmap();
        }
    }
}

// SAFETY: every stack is a private anonymous mapping of its own, page aligned: a guard page
// (no access) below `len` readable and writable bytes (`Mapping::new`). A mapping is owned by
// exactly one `PooledStack` while wasmtime uses it, or by the cache; it is handed out again
// only after its `PooledStack` was dropped, which wasmtime does once the fiber on it is done.
// Reused stacks hold a previous guest's data unless `zeroed` asks otherwise (then their pages
// are discarded, which makes them read as zeros again): wasmtime's pooling allocator reuses
// its stacks the same way, zeroing them only when `Config::async_stack_zeroing` is set.
#[allow(unsafe_code)]
unsafe impl StackCreator for StackPool {
    fn new_stack(&self, size: usize, zeroed: bool) -> wasmtime::Result<Box<dyn StackMemory>> {
        let len = size.div_ceil(page_size()).max(1) * page_size();
        let reused = {
            let mut free = self.cache.lock();
            let at = free.iter().rposition(|m| m.len == len);
            at.map(|i| free.swap_remove(i))
        };
        let mapping = match reused {
            Some(mapping) if zeroed => {
                if let Err(e) = mapping.discard_below(0) {
                    mapping.unmap();
                    return Err(e);
                }
                mapping
            }
            Some(mapping) => mapping,
            None => Mapping::new(len)?,
        };
        Ok(Box::new(PooledStack {
            mapping,
            cache: Arc::clone(&self.cache),
        }))
    }
}

/// A stack in use by one store; returned to its pool's cache when wasmtime drops it.
struct PooledStack {
    mapping: Mapping,
    cache: Arc<Cache>,
}

impl Drop for PooledStack {
    fn drop(&mut self) {
        self.cache.put(self.mapping);
    }
}

// SAFETY: the ranges are those of the mapping this stack owns (see `StackCreator` above): the
// top and both ranges are page aligned, `range` is readable and writable, and `guard_range`
// is the page right below it, mapped with no access, so an overflow faults.
#[allow(unsafe_code)]
unsafe impl StackMemory for PooledStack {
    fn top(&self) -> *mut u8 {
        let m = &self.mapping;
        std::ptr::with_exposed_provenance_mut(m.stack_start() + m.len)
    }

    fn range(&self) -> Range<usize> {
        let m = &self.mapping;
        m.stack_start()..m.stack_start() + m.len
    }

    fn guard_range(&self) -> Range<*mut u8> {
        let m = &self.mapping;
        std::ptr::with_exposed_provenance_mut(m.base)
            ..std::ptr::with_exposed_provenance_mut(m.stack_start())
    }
}

/// A private anonymous mapping: one guard page (no access), then `len` bytes of stack.
///
/// A plain handle: its owner is where it lives, a `PooledStack` (while wasmtime uses it) or
/// a `Cache`; each hands it on or calls [`Mapping::unmap`] when dropped.
#[derive(Clone, Copy)]
struct Mapping {
    /// The guard page's address (the pointer's provenance is exposed).
    base: usize,
    /// The stack's bytes, a multiple of the page size.
    len: usize,
}

impl Mapping {
    /// Maps a guard page and `len` (page-aligned) bytes of stack above it.
    fn new(len: usize) -> wasmtime::Result<Self> {
        let total = len
            .checked_add(page_size())
            .ok_or_else(|| wasmtime::format_err!("fiber stack of {len} bytes is too large"))?;
        // SAFETY: a new mapping at an address the kernel chooses overlaps nothing of ours.
        #[allow(unsafe_code)]
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                total,
                ProtFlags::empty(),
                MapFlags::PRIVATE,
            )
        }
        .map_err(|e| wasmtime::format_err!("mapping a fiber stack of {len} bytes: {e}"))?;
        let mapping = Self {
            base: base.expose_provenance(),
            len,
        };
        // SAFETY: the range lies inside the mapping just made, which nothing else uses yet;
        // only the page below it stays inaccessible.
        #[allow(unsafe_code)]
        let protected = unsafe {
            rustix::mm::mprotect(
                ptr(mapping.stack_start()),
                len,
                MprotectFlags::READ | MprotectFlags::WRITE,
            )
        };
        if let Err(e) = protected {
            mapping.unmap();
            wasmtime::bail!("protecting a fiber stack of {len} bytes: {e}");
        }
        Ok(mapping)
    }

    /// Unmaps it; called once, by its owner, when no fiber runs on it.
    fn unmap(self) {
        // SAFETY: the mapping is this handle's owner's alone (see `StackCreator` above), no
        // fiber runs on it, and its owner drops the handle after this call.
        #[allow(unsafe_code)]
        let unmapped = unsafe { rustix::mm::munmap(ptr(self.base), self.len + page_size()) };
        if let Err(e) = unmapped {
            tracing::warn!(error = %e, "cannot unmap a fiber stack");
        }
    }

    fn stack_start(&self) -> usize {
        self.base + page_size()
    }

    /// Gives the stack's pages back to the kernel, except its top `keep` bytes: they read as
    /// zeros again and cost no memory until touched.
    fn discard_below(&self, keep: usize) -> wasmtime::Result<()> {
        let len = self.len.saturating_sub(keep);
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is inside this mapping, which no fiber runs on (it is in the cache
        // or being handed out); discarding a private anonymous range only makes it zero-filled.
        #[allow(unsafe_code)]
        unsafe { rustix::mm::madvise(ptr(self.stack_start()), len, Advice::LinuxDontNeed) }
            .map_err(|e| wasmtime::format_err!("discarding fiber stack pages: {e}"))
    }
}

/// A pointer to `addr` of a mapping, whose provenance its handle exposed.
fn ptr(addr: usize) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(addr)
}

fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::fs::File;
    use std::os::unix::fs::FileExt;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;
    use std::sync::Mutex;

    use wasmtime::{Config, Engine, Func, Linker, Module, Store};

    use super::*;

    /// wasmtime's default async stack size.
    const SIZE: usize = 2 << 20;

    /// Tells the test binary to run [`overflow_child`] for real.
    const CHILD_ENV: &str = "VVM_STACK_OVERFLOW_CHILD";

    fn stack(pool: &StackPool, zeroed: bool) -> Box<dyn StackMemory> {
        pool.new_stack(SIZE, zeroed).unwrap()
    }

    /// Our own memory through the kernel (`/proc/self/mem`), as a debugger would see it.
    fn mem() -> File {
        File::options()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .unwrap()
    }

    fn peek(at: usize) -> u8 {
        let mut b = [0];
        mem().read_exact_at(&mut b, at as u64).unwrap();
        b[0]
    }

    fn poke(at: usize, b: u8) {
        mem().write_all_at(&[b], at as u64).unwrap();
    }

    /// An engine whose on-demand allocator takes its stacks from `pool`.
    fn engine(pool: &Arc<StackPool>) -> Engine {
        let mut config = Config::new();
        config.with_host_stack(Arc::clone(pool) as Arc<dyn StackCreator>);
        Engine::new(&config).unwrap()
    }

    #[test]
    fn a_dropped_stack_is_handed_out_again() {
        let pool = StackPool::new(4);
        let first = stack(&pool, false);
        let top = first.top().addr();
        assert_eq!(first.range().end, top);
        assert_eq!(first.range().len(), SIZE);
        assert_eq!(pool.cached(), 0);
        drop(first);
        assert_eq!(pool.cached(), 1);
        let again = stack(&pool, false);
        assert_eq!(again.top().addr(), top);
        assert_eq!(pool.cached(), 0);
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound() {
        let pool = StackPool::new(2);
        let stacks: Vec<_> = (0..3).map(|_| stack(&pool, false)).collect();
        let mut tops: Vec<usize> = stacks.iter().map(|s| s.top().addr()).collect();
        tops.dedup();
        assert_eq!(
            tops.len(),
            3,
            "three stacks in use at once are three mappings"
        );
        drop(stacks);
        assert_eq!(pool.cached(), 2);
        // The third was unmapped: its pages are gone from the process.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mapped = |top: usize| {
            maps.lines().any(|l| {
                let (range, _) = l.split_once(' ').unwrap();
                let (start, end) = range.split_once('-').unwrap();
                let start = usize::from_str_radix(start, 16).unwrap();
                let end = usize::from_str_radix(end, 16).unwrap();
                start < top && top <= end
            })
        };
        assert_eq!(tops.iter().filter(|t| mapped(**t)).count(), 2);
    }

    #[test]
    fn a_reused_stack_keeps_only_its_top_pages_and_is_zeroed_when_asked() {
        let pool = StackPool::new(1);
        let s = stack(&pool, true);
        let (hot, cold) = (s.top().addr() - 8, s.range().start);
        poke(hot, 0xa5);
        poke(cold, 0x5a);
        drop(s);
        let s = stack(&pool, false);
        assert_eq!(s.range().start, cold, "the same stack");
        assert_eq!(peek(hot), 0xa5, "its top pages were kept");
        assert_eq!(peek(cold), 0, "the pages below were given back");
        drop(s);
        let s = stack(&pool, true);
        assert_eq!(s.range().start, cold, "the same stack");
        assert_eq!(peek(hot), 0, "zeroed when asked");
    }

    #[test]
    fn the_guard_page_is_right_below_the_stack() {
        let pool = StackPool::new(1);
        let s = stack(&pool, false);
        let guard = s.guard_range();
        assert_eq!(guard.end.addr(), s.range().start);
        assert_eq!(guard.end.addr() - guard.start.addr(), page_size());
    }

    /// A host function on the fiber that recurses until the stack runs out.
    fn recurse(depth: usize) -> usize {
        let frame = std::hint::black_box([depth; 512]);
        if std::hint::black_box(depth) == usize::MAX {
            return frame[0];
        }
        recurse(depth + 1) + std::hint::black_box(frame)[1]
    }

    #[test]
    #[ignore = "run by overflowing_a_pooled_stack_faults_on_its_guard_page in a child process"]
    fn overflow_child() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        let pool = Arc::new(StackPool::new(1));
        let engine = engine(&pool);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // A stack handed out once already, as most are.
        let mut store = Store::new(&engine, ());
        let noop = Func::wrap(&mut store, || {});
        rt.block_on(noop.call_async(&mut store, &[], &mut []))
            .unwrap();
        drop(store);
        assert_eq!(pool.cached(), 1);
        let mut store = Store::new(&engine, ());
        let func = Func::wrap(&mut store, || {
            recurse(0);
        });
        println!("@@ overflowing");
        let _ = rt.block_on(func.call_async(&mut store, &[], &mut []));
        println!("@@ survived");
    }

    #[test]
    fn overflowing_a_pooled_stack_faults_on_its_guard_page() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "runtime::stacks::tests::overflow_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stdout.contains("@@ overflowing"), "{stdout}");
        assert!(!stdout.contains("@@ survived"), "{stdout}");
        // wasmtime's signal handler aborts with this message only for a fault at an address
        // inside the store's async guard range, the `guard_range` the pool reported.
        assert!(
            stderr.contains("execution on async fiber has overflowed its stack"),
            "{:?}: {stderr}",
            out.status
        );
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{:?}", out.status);
    }

    /// `(module (import "host" "probe" (func)) (func (export "run") call 0))`.
    const PROBE_GUEST: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
        0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // types: [] -> []
        0x02, 0x0e, 0x01, 0x04, b'h', b'o', b's', b't', 0x05, b'p', b'r', b'o', b'b', b'e', 0x00,
        0x00, // import host.probe
        0x03, 0x02, 0x01, 0x00, // one function of type 0
        0x07, 0x07, 0x01, 0x03, b'r', b'u', b'n', 0x00, 0x01, // export "run" = func 1
        0x0a, 0x06, 0x01, 0x04, 0x00, 0x10, 0x00, 0x0b, // body: call 0
    ];

    #[tokio::test]
    async fn a_recycled_stack_runs_a_guest() {
        let pool = Arc::new(StackPool::new(1));
        let engine = engine(&pool);
        let module = Module::new(&engine, PROBE_GUEST).unwrap();
        // Where the guest's call into the host ran, and how many stacks the pool held then.
        let seen: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
        let mut linker = Linker::new(&engine);
        let (probe_pool, probe_seen) = (Arc::clone(&pool), Arc::clone(&seen));
        linker
            .func_wrap("host", "probe", move || {
                let local = 0_u8;
                let at = std::ptr::from_ref(&local).addr();
                probe_seen.lock().unwrap().push((at, probe_pool.cached()));
            })
            .unwrap();
        let mut ranges = Vec::new();
        for _ in 0..2 {
            let mut store = Store::new(&engine, ());
            let instance = linker.instantiate_async(&mut store, &module).await.unwrap();
            let run = instance
                .get_typed_func::<(), ()>(&mut store, "run")
                .unwrap();
            run.call_async(&mut store, ()).await.unwrap();
            drop(store);
            let free = pool.cache.lock();
            ranges.push(free[0].stack_start()..free[0].stack_start() + free[0].len);
        }
        let seen = seen.lock().unwrap();
        assert_eq!(
            ranges[0], ranges[1],
            "the second guest got the first one's stack"
        );
        assert_eq!(seen.len(), 2);
        for (at, cached) in seen.iter() {
            assert!(ranges[0].contains(at), "the guest ran on the pool's stack");
            assert_eq!(*cached, 0, "taken from the pool while in use");
        }
    }
}
