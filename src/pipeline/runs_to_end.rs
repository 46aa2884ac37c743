//! A delivery that runs to its end even if its request goes away: the request polls it in
//! place, and only if the request's future is dropped first (the client reset the stream
//! or closed the connection) does the rest of it move to a task of its own. A delivery past
//! its signature may publish, and a publish must be followed by its guard state and done
//! marks.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future polled where it is awaited, handed to a task of its own when dropped before
/// its end. In a box: a pinned future cannot move, its box can.
pub struct RunsToEnd<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    running: Option<Pin<Box<F>>>,
}

impl<F: Future + Send + 'static> RunsToEnd<F>
where
    F::Output: Send + 'static,
{
    pub fn new(future: F) -> Self {
        Self {
            running: Some(Box::pin(future)),
        }
    }
}

impl<F: Future + Send + 'static> Future for RunsToEnd<F>
where
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Taken out while polled: should the future panic, it unwinds with it and is not
        // handed on half run.
        let Some(mut running) = self.running.take() else {
            return Poll::Pending;
        };
        match running.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(output),
            Poll::Pending => {
                self.running = Some(running);
                Poll::Pending
            }
        }
    }
}

impl<F: Future + Send + 'static> Drop for RunsToEnd<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        // Outside a runtime nothing could poll it further: it is dropped.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(running);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn a_future_awaited_to_its_end_gives_its_output() {
        assert_eq!(RunsToEnd::new(async { 7 }).await, 7);
    }

    #[tokio::test]
    async fn a_future_dropped_half_way_runs_on_in_a_task_of_its_own() {
        let (go, gone) = oneshot::channel::<()>();
        let (done_tx, done) = oneshot::channel();
        let started = Arc::new(AtomicBool::new(false));
        let seen = started.clone();
        let mut running = Box::pin(RunsToEnd::new(async move {
            seen.store(true, Ordering::SeqCst);
            let _ = gone.await;
            let _ = done_tx.send("finished");
        }));
        // One poll: it starts, then waits for `go`.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(running.as_mut().poll(&mut cx).is_pending());
        assert!(started.load(Ordering::SeqCst));
        drop(running);
        let _ = go.send(());
        assert_eq!(done.await, Ok("finished"));
    }
}
