//! Boxed futures that hand their allocation on to the next future of the
//! same kind: what every acquisition boxes once (a release, a try's
//! statement) is allocated once per thread, not once per lock.
//!
//! A database driver's statement future is large (tokio-postgres's
//! `query_opt` alone is 1,072 bytes), so a future holding one is past
//! glibc's per-thread cache (1,032 bytes): allocating and freeing it per
//! acquisition took the slow path of `malloc`, and, at 1,024 bytes and up,
//! a consolidation of the fast bins each time (issue #25's callgrind
//! figures). Here each kind of future has a per-thread *shelf* holding one
//! spare allocation: a new future of the same size and alignment is moved
//! into it, and once the future has finished (dropped in place, which for
//! a finished `async` block drops nothing), its allocation goes back on
//! the shelf of whichever thread finished it. A future dropped before it
//! finishes frees its allocation as any box does.
//!
//! Not `tokio_util::sync::ReusableBoxFuture`: it does the same, but moves
//! the new future three times on its way into the box (through a drop
//! guard's closure), which at these sizes cost 650 instructions of
//! `memcpy` per cycle, a third of what reuse saves. Here it is not moved
//! at all: [`Reused::new`] takes a closure that makes the future and
//! writes its result straight into the allocation, so only what the future
//! starts with (its captures) is written, where `Box::new(fut)` copies all
//! of its bytes (for the release and the acquisition, ~310 instructions
//! per cycle).

use std::alloc::Layout;
use std::cell::Cell;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};
use std::thread::LocalKey;

/// One spare allocation per thread for one kind of future.
pub(crate) type Shelf = LocalKey<Cell<Option<Spare>>>;

/// Declares [`Shelf`]s: `shelf! { /// doc  static NAME; ... }`.
macro_rules! shelf {
    ($($(#[$meta:meta])* $vis:vis static $name:ident;)+) => {
        thread_local! {
            $(
                $(#[$meta])*
                $vis static $name: std::cell::Cell<Option<$crate::core::reuse::Spare>> =
                    const { std::cell::Cell::new(None) };
            )+
        }
    };
}
pub(crate) use shelf;

/// An allocation of the global allocator, of `layout` (never zero-sized),
/// holding no value; freed when dropped.
pub(crate) struct Spare {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for Spare {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated by the global allocator with
        // `layout` (a `Box` of a value of that layout gave it up, see
        // `Reused::poll`), holds no value, and is freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A boxed future whose allocation, once the future has finished, goes
/// back on its [`Shelf`] for the next one.
///
/// The future may borrow (`'a`): a spare allocation is only memory, and
/// goes back on the shelf after the future in it has been dropped.
pub(crate) struct Reused<'a, T> {
    fut: Option<Pin<Box<dyn Future<Output = T> + Send + 'a>>>,
    shelf: &'static Shelf,
}

impl<'a, T> Reused<'a, T> {
    /// The future `make` returns, built in the shelf's spare allocation if
    /// that has the future's size and alignment, else in a new box.
    ///
    /// Built in place: the allocation is found first and `make`'s result
    /// written straight into it, so only what the future starts with (its
    /// captures) is written, not all of its bytes moved from the stack
    /// (a `Box::new(fut)` copied the 1,464-byte release future whole).
    #[inline]
    pub(crate) fn new<F>(shelf: &'static Shelf, make: impl FnOnce() -> F) -> Self
    where
        F: Future<Output = T> + Send + 'a,
    {
        let layout = Layout::new::<F>();
        let mut mem: Box<MaybeUninit<F>> = match shelf.try_with(Cell::take).ok().flatten() {
            Some(spare) if spare.layout == layout => {
                let ptr = spare.ptr.as_ptr().cast::<MaybeUninit<F>>();
                std::mem::forget(spare);
                // SAFETY: the spare was allocated by the global allocator
                // with `F`'s layout (it has the same size and alignment)
                // and holds no value; a `MaybeUninit` needs none.
                unsafe { Box::from_raw(ptr) }
            }
            _ => Box::new_uninit(),
        };
        mem.write(make());
        // SAFETY: written just above.
        let boxed = unsafe { mem.assume_init() };
        Reused {
            fut: Some(Box::into_pin(boxed)),
            shelf,
        }
    }

    /// [`Reused::new`], out of line: for a future made on a path of a hot
    /// function that its common case does not take (PostgreSQL's waits,
    /// for an acquisition whose try got the lock). Inlined, the future is
    /// built in a slot of the caller's own stack frame, and its code among
    /// the caller's, which every poll of the caller then spans, taken or
    /// not (BENCHMARKS.md, "Rare paths out of line"). Where the path is the
    /// common one (a wait in the server is every acquisition of MySQL and
    /// etcd), it costs one call more.
    #[inline(never)]
    pub(crate) fn new_cold<F>(shelf: &'static Shelf, make: impl FnOnce() -> F) -> Self
    where
        F: Future<Output = T> + Send + 'a,
    {
        Self::new(shelf, make)
    }
}

/// `Box::pin(make())`, out of line: as [`Reused::new_cold`], for a rare
/// path's future boxed on its own.
#[inline(never)]
pub(crate) fn boxed_cold<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::pin(make())
}

impl<T> Future for Reused<'_, T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Pending;
        };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        if let Some(done) = self.fut.take() {
            // SAFETY: the future is dropped in place below and never used
            // again; its allocation outlives it only as raw memory.
            let raw = Box::into_raw(unsafe { Pin::into_inner_unchecked(done) });
            // SAFETY: `raw` is a live value, from the box just given up.
            let layout = Layout::for_value(unsafe { &*raw });
            // SAFETY: as above; dropped once, and not touched afterwards
            // but as memory. A finished `async` block drops nothing.
            unsafe { std::ptr::drop_in_place(raw) };
            if layout.size() > 0 {
                // SAFETY: a box's pointer is never null.
                let ptr = unsafe { NonNull::new_unchecked(raw.cast::<u8>()) };
                let spare = Spare { ptr, layout };
                // After the thread's shelves are gone, `spare` is freed.
                let _ = self.shelf.try_with(move |s| s.set(Some(spare)));
            }
        }
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    shelf! {
        static TEST_SHELF;
    }

    fn spare_addr() -> Option<usize> {
        TEST_SHELF.with(|s| {
            let spare = s.take()?;
            let addr = spare.ptr.as_ptr() as usize;
            s.set(Some(spare));
            Some(addr)
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_finished_future_leaves_its_box_for_the_next() {
        assert_eq!(spare_addr(), None);
        let big = [7u8; 1500];
        assert_eq!(Reused::new(&TEST_SHELF, || async move { big.len() }).await, 1500);
        let first = spare_addr().expect("the box went back on the shelf");
        let big = [8u8; 1500];
        let second = Reused::new(&TEST_SHELF, || async move { big.len() + 1 });
        // Taken off the shelf while in use.
        assert_eq!(spare_addr(), None);
        assert_eq!(second.await, 1501);
        assert_eq!(spare_addr(), Some(first), "the same allocation served again");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_future_takes_its_box_and_drops_what_it_held() {
        let held = std::sync::Arc::new(());
        let h = held.clone();
        let pending = Reused::new(&TEST_SHELF, || async move {
            let _h = h;
            std::future::pending::<()>().await;
            0
        });
        assert_eq!(std::sync::Arc::strong_count(&held), 2);
        drop(pending);
        assert_eq!(std::sync::Arc::strong_count(&held), 1);
        assert_eq!(spare_addr(), None);
        // A future of another size gets a box of its own.
        let small = 5usize;
        assert_eq!(Reused::new(&TEST_SHELF, || async move { small }).await, 5);
        assert!(spare_addr().is_some());
    }
}
