//! The crate's blocking locks: std's `Mutex` and `RwLock`, with the poisoning policy decided once,
//! here (after quinn's `mutex.rs`), instead of at every call.
//!
//! **The policy: a poisoned lock is recovered** ([`PoisonError::into_inner`]): [`Mutex::lock`],
//! [`RwLock::read`] and [`RwLock::write`] return the guard whether or not a thread panicked while
//! holding it. That is sound for every structure behind these locks in `ratemesh` and `ratemeshd`,
//! as checked at each use when this module replaced the per-call handling. Each is recomputed
//! from what is recorded on every use (the RLQS ledger and hub), plain counters (rate history,
//! snapshot metrics), replaced whole in one assignment (the daemon's configuration and source, xDS
//! documents, the overrides index, a calendar policy's cached window, a gossip handle slot, the
//! saved snapshot generation), changed one insert, remove or push at a time (transport peers, the
//! memory network, the node's tasks, the top-keys admitted names, the live overrides table entry
//! by entry), or holds no data (the overrides' save lock). No panic can leave one torn, so
//! propagating it would only turn one failed task into a node or daemon that fails every later
//! call. A lock whose data could be left torn must not use these types: use std's and decide
//! there, explicitly.
//!
//! The guards are std's (no wrapper): code that names a guard type names
//! `std::sync::MutexGuard` and friends. Asynchronous locks (`tokio::sync`) and the lanes'
//! `parking_lot` mutexes (no poisoning) are not these.

use std::fmt;
use std::sync::{MutexGuard, PoisonError, RwLockReadGuard, RwLockWriteGuard};

/// A mutual-exclusion lock whose [`lock`](Mutex::lock) recovers a poisoned lock (see the
/// module's policy, the crate's one place that decides it).
#[derive(Default)]
pub struct Mutex<T: ?Sized> {
    inner: std::sync::Mutex<T>,
}

impl<T> Mutex<T> {
    /// A lock holding `value`.
    pub const fn new(value: T) -> Self {
        Mutex { inner: std::sync::Mutex::new(value) }
    }

    /// The value, the lock consumed (poisoned or not).
    pub fn into_inner(self) -> T {
        self.inner.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Blocks until the lock is held and returns its guard, also when a thread panicked while
    /// holding it (the data is still consistent: see the module's policy).
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, through the exclusive borrow (no locking; poisoned or not).
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

/// A reader-writer lock whose [`read`](RwLock::read) and [`write`](RwLock::write) recover a
/// poisoned lock (see the module's policy, the crate's one place that decides it).
#[derive(Default)]
pub struct RwLock<T: ?Sized> {
    inner: std::sync::RwLock<T>,
}

impl<T> RwLock<T> {
    /// A lock holding `value`.
    pub const fn new(value: T) -> Self {
        RwLock { inner: std::sync::RwLock::new(value) }
    }

    /// The value, the lock consumed (poisoned or not).
    pub fn into_inner(self) -> T {
        self.inner.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Blocks until the lock is held shared and returns its guard, also when a writer panicked
    /// while holding it (see the module's policy).
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks until the lock is held exclusively and returns its guard, also when a writer
    /// panicked while holding it (see the module's policy).
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, through the exclusive borrow (no locking; poisoned or not).
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

#[cfg(test)]
mod tests {
    use super::{Mutex, RwLock};

    #[test]
    fn a_poisoned_lock_is_recovered() {
        let mutex = Mutex::new(1);
        let lock = RwLock::new(1);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = mutex.lock();
            let _written = lock.write();
            panic!("poison both");
        }));
        assert!(panicked.is_err());
        assert!(mutex.inner.is_poisoned() && lock.inner.is_poisoned());
        *mutex.lock() += 1;
        *lock.write() += 1;
        assert_eq!((*mutex.lock(), *lock.read()), (2, 2));
        assert_eq!((mutex.into_inner(), lock.into_inner()), (2, 2));
    }
}
