//! Bodies the proxy passes on changed or watched: [`Rewritten`] (a request's
//! placeholders made values, or an answer's values made placeholders, as the
//! bytes stream: [`super::secrets::Rewriter`]) and [`Watched`] (a package file
//! or an index page kept, by its [`Keeper`], as it streams to the sandbox).

use super::cache;
use super::secrets::Rewriter;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use std::pin::Pin;
use std::task::{Context, Poll};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every body the proxy sends, either way.
pub type Body = BoxBody<Bytes, BoxError>;

/// The error a body gives when it meets a placeholder where it may not go.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a placeholder of secret {} where it may not go", self.0)
    }
}

impl std::error::Error for Refused {}

/// A body rewritten as it streams. Trailers are not passed on (the proxy drops
/// the `Trailer` header): the body ends with what the rewriter still held.
pub struct Rewritten {
    inner: Body,
    rewriter: Rewriter,
    finished: bool,
}

impl Rewritten {
    pub fn new(inner: Body, rewriter: Rewriter) -> Rewritten {
        Rewritten { inner, rewriter, finished: false }
    }

    /// The end: what the rewriter held back, rewritten.
    fn end(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.finished = true;
        match self.rewriter.finish() {
            Ok(out) if out.is_empty() => Poll::Ready(None),
            Ok(out) => Poll::Ready(Some(Ok(Frame::data(Bytes::from(out))))),
            Err(name) => Poll::Ready(Some(Err(Box::new(Refused(name))))),
        }
    }
}

impl HttpBody for Rewritten {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => match self.rewriter.push(&data) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out))))),
                        Err(name) => return Poll::Ready(Some(Err(Box::new(Refused(name))))),
                    },
                    // Trailers come after the data: the data ends here.
                    Err(_trailers) => return self.end(),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return self.end(),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What a [`Watched`] body hands the bytes passing to, to keep them once the body
/// came whole: a package file for the cache ([`cache::Writer`]), an index page
/// ([`super::pages`]).
pub trait Keeper: Send + Unpin + 'static {
    /// A chunk passed. `false`: this keeper gives up (it is dropped, nothing kept).
    fn take(&mut self, data: &Bytes) -> bool;
    /// The whole body passed: keep it.
    fn whole(self);
}

/// A body streaming to the sandbox, watched by a [`Keeper`] that keeps it only if
/// it ends whole: a body that breaks off, or that the sandbox stops reading, is
/// dropped with its keeper.
pub struct Watched<K: Keeper> {
    inner: Body,
    keeper: Option<K>,
}

impl<K: Keeper> Watched<K> {
    pub fn new(inner: Body, keeper: K) -> Watched<K> {
        Watched { inner, keeper: Some(keeper) }
    }

    fn keep(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.whole();
        }
    }
}

impl<K: Keeper> HttpBody for Watched<K> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(k)) = (frame.data_ref(), self.keeper.as_mut()) {
                    if !k.take(data) {
                        self.keeper = None;
                    }
                }
                // A body of known length is over with its last bytes: hyper may not
                // ask for more, so it is kept now.
                if self.inner.is_end_stream() {
                    self.keep();
                }
            }
            Poll::Ready(None) => self.keep(),
            // An error: the body is not whole, and is dropped with the keeper.
            Poll::Ready(Some(Err(_))) => self.keeper = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A file of the index kept in the cache as it streams to the sandbox (only if it
/// arrives whole and hashes to its digest: [`cache::Writer::commit`]).
impl Keeper for cache::Writer {
    fn take(&mut self, data: &Bytes) -> bool {
        self.write(data);
        true
    }

    fn whole(self) {
        if self.commit() {
            tracing::debug!("a package file was kept in the cache");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::rules::{Host, HostPattern};
    use crate::egress::secrets::{Secret, Secrets};
    use crate::model::policy::SecretPlace;
    use http_body_util::BodyExt;

    /// A body of `frames`: data, then trailers.
    fn body(data: &[&'static [u8]], trailers: bool) -> Body {
        let mut frames: Vec<Result<Frame<Bytes>, BoxError>> =
            data.iter().map(|d| Ok(Frame::data(Bytes::from_static(d)))).collect();
        if trailers {
            frames.push(Ok(Frame::trailers(hyper::HeaderMap::new())));
        }
        http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
    }

    #[tokio::test]
    async fn a_rewritten_body_ends_whole_even_when_trailers_follow() {
        let secrets = Secrets(vec![Secret {
            name: "K".into(),
            hosts: vec![HostPattern::parse("api.example.com").unwrap()],
            value: "the-value".into(),
            placeholder: "sandboxd-secret-aaaa".into(),
            places: vec![SecretPlace::Headers],
            own: false,
            retired: false,
        }]);
        let host = Host::parse("api.example.com").unwrap();
        for trailers in [false, true] {
            let rewriter = secrets.incoming(&host).unwrap();
            let answer = Rewritten::new(body(&[b"key the-v", b"alue ok"], trailers), rewriter);
            let got = answer.collect().await.unwrap().to_bytes();
            assert_eq!(&got[..], b"key sandboxd-secret-aaaa ok", "trailers: {trailers}");
        }
    }
}
