//! Asking a listener's open connections to close when it stops. Each connection waits on
//! a signal of its own, which its watcher polls at every wake-up of the connection: a
//! cancellation wait shared by all connections would take the lock of its waiter list at
//! every one of those polls.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

/// The connections to ask to close, each by the sender of its signal.
#[derive(Default)]
pub(super) struct CloseRequests {
    state: Mutex<Registered>,
}

#[derive(Default)]
struct Registered {
    next_id: u64,
    waiting: HashMap<u64, oneshot::Sender<()>>,
    /// Set once all were asked: a connection that registers later is asked at once.
    asked: bool,
}

impl CloseRequests {
    fn lock(&self) -> MutexGuard<'_, Registered> {
        // The map stays whole whatever panicked while it was held.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection's signal, ready once the listener stops (at once if it has).
    pub(super) fn register(&self) -> CloseRequest<'_> {
        let (sender, receiver) = oneshot::channel();
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        if state.asked {
            let _ = sender.send(());
        } else {
            state.waiting.insert(id, sender);
        }
        CloseRequest {
            requests: self,
            id,
            receiver,
        }
    }

    /// Asks every open connection, and every one that registers from now on, to close.
    pub(super) fn ask_all(&self) {
        let waiting = {
            let mut state = self.lock();
            state.asked = true;
            std::mem::take(&mut state.waiting)
        };
        for sender in waiting.into_values() {
            let _ = sender.send(());
        }
    }
}

/// One connection's signal; unregistered when dropped.
pub(super) struct CloseRequest<'a> {
    requests: &'a CloseRequests,
    id: u64,
    receiver: oneshot::Receiver<()>,
}

impl Future for CloseRequest<'_> {
    type Output = ();

    /// Ready once asked. Must not be polled again after that.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // The sender is only dropped once it has sent, so either ending is the request.
        Pin::new(&mut self.receiver).poll(cx).map(|_| ())
    }
}

impl Drop for CloseRequest<'_> {
    fn drop(&mut self) {
        self.requests.lock().waiting.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn connections_open_before_and_after_the_stop_are_asked_and_closed_ones_forgotten() {
        let requests = CloseRequests::default();
        let mut before = requests.register();
        let gone = requests.register();
        drop(gone);
        assert_eq!(requests.lock().waiting.len(), 1);
        assert!(
            (&mut before).now_or_never().is_none(),
            "asked before the stop"
        );
        requests.ask_all();
        assert!((&mut before).now_or_never().is_some());
        let mut after = requests.register();
        assert!(
            (&mut after).now_or_never().is_some(),
            "a late one is asked at once"
        );
        drop((before, after));
        assert!(requests.lock().waiting.is_empty());
    }
}
