//! Push wake-ups on Redis: `SUBSCRIBE` to a channel per lease, published by
//! the release and clear scripts (and for `watch`, a second one, published
//! by the acquire scripts).

use std::pin::Pin;

use crate::store::wake::{Heard, Wakeups};
use crate::store::StoreError;

/// The channel the release and clear scripts publish on for `name`. One
/// channel per lease (Redis channel names have no length limit), in the
/// lease's hash tag so a cluster routes it with the lease's keys.
pub fn redis_channel(name: &str) -> String {
    format!("{{leaderrun:{name}}}:released")
}

/// The channel the acquire scripts publish on for `name`, in the same hash
/// tag (and so under the same ACL pattern, `&{leaderrun:*`). Only `watch`
/// subscribes to it.
pub fn redis_acquired_channel(name: &str) -> String {
    format!("{{leaderrun:{name}}}:acquired")
}

pub struct RedisWakeups {
    client: ::redis::Client,
    /// The lease's channels ([`redis_channel`], and for `watch`
    /// [`redis_acquired_channel`]).
    channels: Vec<String>,
    sub: Option<::redis::aio::PubSub>,
}

impl RedisWakeups {
    pub(crate) fn new(client: ::redis::Client, name: &str, heard: Heard) -> RedisWakeups {
        let mut channels = vec![redis_channel(name)];
        if heard == Heard::Changes {
            channels.push(redis_acquired_channel(name));
        }
        RedisWakeups {
            client,
            channels,
            sub: None,
        }
    }
}

impl Wakeups for RedisWakeups {
    async fn arm(&mut self) -> Result<(), StoreError> {
        let err =
            |e: ::redis::RedisError| StoreError::unavailable(format!("cannot SUBSCRIBE: {e}"));
        if self.sub.is_none() {
            let mut s = self.client.get_async_pubsub().await.map_err(err)?;
            for c in &self.channels {
                s.subscribe(c).await.map_err(err)?;
            }
            self.sub = Some(s);
        }
        // Drain what already arrived: the attempt that follows sees it.
        if let Some(s) = self.sub.as_mut() {
            let mut stream = s.on_message();
            loop {
                let next = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(futures_core::Stream::poll_next(
                        Pin::new(&mut stream),
                        cx,
                    ))
                })
                .await;
                match next {
                    std::task::Poll::Ready(Some(_)) => continue,
                    std::task::Poll::Ready(None) => {
                        drop(stream);
                        self.sub = None;
                        return Err(StoreError::unavailable("the SUBSCRIBE connection was lost"));
                    }
                    std::task::Poll::Pending => break,
                }
            }
        }
        Ok(())
    }

    async fn wake(&mut self) -> Result<(), StoreError> {
        let Some(s) = self.sub.as_mut() else {
            return Err(StoreError::unavailable("not subscribed"));
        };
        let got = {
            let mut stream = s.on_message();
            std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut stream), cx))
                .await
                .is_some()
        };
        if got {
            // Only this lease's channels are subscribed.
            Ok(())
        } else {
            self.sub = None;
            Err(StoreError::unavailable("the SUBSCRIBE connection was lost"))
        }
    }
}
