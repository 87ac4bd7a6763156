//! One lock-poisoning policy for the whole host: a `Mutex` poisoned by a panic is used as it is.
//!
//! Every critical section here is a single insert, remove, push or replace, so a panic elsewhere
//! in the holding thread cannot leave the data half-changed; refusing the lock afterwards would
//! only turn one host bug into a stuck control loop or a crashed kubelet call. The panic itself is
//! logged where it happens.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub trait Locked<T> {
    /// The guard, whether or not a holder panicked.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("a host bug while holding the lock");
        })
        .join();
        assert!(m.is_poisoned());
        m.locked().push(2);
        assert_eq!(*m.locked(), [1, 2]);
    }
}
