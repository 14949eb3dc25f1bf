//! A bounded queue from one task to one stream, for long-lived gRPC streams.
//!
//! A member may hold tens of thousands of idle Watch streams, and each keeps its reply queue
//! for as long as it is open. tokio's bounded `mpsc` channel costs about 800 bytes per stream
//! before the first message (a cache-padded channel of 512 bytes and a first block of 32
//! slots), which was the largest single part of an idle stream. This one has one producer,
//! one consumer and a handful of slots held inline: about 120 bytes in one allocation.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio_stream::Stream;

/// Slots: how far the producer may run ahead of the consumer.
pub(crate) const SLOTS: usize = 4;

struct State<T> {
    slots: [Option<T>; SLOTS],
    /// Index of the oldest item.
    head: usize,
    len: usize,
    /// The consumer waits for an item (or for the producer to go).
    consumer: Option<Waker>,
    /// The producer waits for a free slot (or for the consumer to go).
    producer: Option<Waker>,
    producer_gone: bool,
    consumer_gone: bool,
}

type Shared<T> = Arc<Mutex<State<T>>>;

fn lock<T>(s: &Shared<T>) -> MutexGuard<'_, State<T>> {
    // Nothing here panics while holding the lock; a poisoned lock still holds sound state.
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The producing end.
pub(crate) struct Sender<T>(Shared<T>);

/// The consuming end: a `Stream` that ends once the sender is dropped and the queue is empty.
pub(crate) struct Receiver<T>(Shared<T>);

/// The consumer is gone: nothing sent would be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Closed;

pub(crate) fn pipe<T>() -> (Sender<T>, Receiver<T>) {
    let state = State {
        slots: std::array::from_fn(|_| None),
        head: 0,
        len: 0,
        consumer: None,
        producer: None,
        producer_gone: false,
        consumer_gone: false,
    };
    let shared = Arc::new(Mutex::new(state));
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Ready once a slot is free; `Err` once the consumer is gone. A slot found free stays
    /// free until this sender fills it: there is no other producer.
    pub(crate) fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), Closed>> {
        let mut s = lock(&self.0);
        if s.consumer_gone {
            return Poll::Ready(Err(Closed));
        }
        if s.len < SLOTS {
            return Poll::Ready(Ok(()));
        }
        s.producer = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Waits for a free slot; see [`Sender::poll_ready`].
    /// Slots free right now, for a producer that hands over what fits without waiting.
    pub(crate) fn room(&self) -> Result<usize, Closed> {
        let s = lock(&self.0);
        if s.consumer_gone {
            return Err(Closed);
        }
        Ok(SLOTS - s.len)
    }

    pub(crate) async fn ready(&self) -> Result<(), Closed> {
        poll_fn(|cx| self.poll_ready(cx)).await
    }

    /// Queues `item` in a slot that [`Sender::ready`] found free. Without one, the item is
    /// dropped and `Err` returned (only when the consumer is gone, used correctly).
    pub(crate) fn push(&self, item: T) -> Result<(), Closed> {
        let mut s = lock(&self.0);
        if s.consumer_gone || s.len == SLOTS {
            return Err(Closed);
        }
        let at = (s.head + s.len) % SLOTS;
        s.slots[at] = Some(item);
        s.len += 1;
        let consumer = s.consumer.take();
        drop(s);
        if let Some(w) = consumer {
            w.wake();
        }
        Ok(())
    }

    /// Waits for a slot and queues `item`.
    pub(crate) async fn send(&self, item: T) -> Result<(), Closed> {
        self.ready().await?;
        self.push(item)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = lock(&self.0);
        s.producer_gone = true;
        let consumer = s.consumer.take();
        drop(s);
        if let Some(w) = consumer {
            w.wake();
        }
    }
}

impl<T> Stream for Receiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = lock(&self.0);
        if s.len > 0 {
            let head = s.head;
            let item = s.slots[head].take();
            s.head = (head + 1) % SLOTS;
            s.len -= 1;
            let producer = s.producer.take();
            drop(s);
            if let Some(w) = producer {
                w.wake();
            }
            return Poll::Ready(item);
        }
        if s.producer_gone {
            return Poll::Ready(None);
        }
        s.consumer = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut s = lock(&self.0);
        s.consumer_gone = true;
        // Items queued are dropped with the last handle; the producer learns at once.
        let producer = s.producer.take();
        drop(s);
        if let Some(w) = producer {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn items_arrive_in_order_and_the_stream_ends_after_the_sender() {
        let (tx, mut rx) = pipe::<u32>();
        let producer = tokio::spawn(async move {
            for i in 0..100 {
                tx.send(i).await.expect("consumer is there");
            }
        });
        let got: Vec<u32> = (&mut rx).collect().await;
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        producer.await.expect("producer");
    }

    #[tokio::test]
    async fn the_producer_waits_for_a_free_slot() {
        let (tx, mut rx) = pipe::<u32>();
        for i in 0..SLOTS as u32 {
            tx.push(i).expect("room");
        }
        assert_eq!(tx.push(99), Err(Closed), "a full pipe takes nothing more");
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), tx.ready());
        assert!(waiting.await.is_err(), "ready must wait while every slot is full");
        assert_eq!(rx.next().await, Some(0));
        tx.ready().await.expect("a slot was freed");
        tx.push(4).expect("room");
        drop(tx);
        let rest: Vec<u32> = rx.collect().await;
        assert_eq!(rest, vec![1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_waiting_producer_learns_the_consumer_left() {
        let (tx, rx) = pipe::<u32>();
        for i in 0..SLOTS as u32 {
            tx.push(i).expect("room");
        }
        let waiter = tokio::spawn(async move { tx.send(7).await });
        tokio::task::yield_now().await;
        drop(rx);
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
        assert_eq!(r.expect("woken").expect("joined"), Err(Closed));
    }

    #[test]
    fn an_idle_pipe_is_small() {
        // The point of the type: see the module's comment.
        assert!(std::mem::size_of::<Mutex<State<Box<u64>>>>() <= 128);
    }
}
