//! A std lock taken whatever a panicking holder left behind. No state behind the locks of the
//! proxy or the simulator is left half-written by a panic that matters more than the process
//! going on (each is updated by a statement or a few that keep it usable), so a poisoned lock
//! is taken as it is: one panic never turns every later request that takes the same lock into
//! another.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A mutex taken, poisoned or not.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A read-write lock taken to read or to write, poisoned or not.
pub trait ReadWrite<T: ?Sized> {
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_with_what_it_holds() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let w = std::sync::Arc::new(RwLock::new(2));
        let (m2, w2) = (m.clone(), w.clone());
        let _ = std::thread::spawn(move || {
            let _held = m2.lock();
            let _written = w2.write();
            panic!("poisons both");
        })
        .join();
        assert!(m.is_poisoned() && w.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
        *w.writing() += 1;
        assert_eq!(*w.reading(), 3);
    }
}
