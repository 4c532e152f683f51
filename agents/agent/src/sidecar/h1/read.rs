//! Reading a request head off a client connection: the header-read timeout, the
//! listener's stop while a connection waits for its next request, and the grace a
//! connection's first request gets after the stop ([`FIRST_REQUEST_GRACE`]).

use super::*;

impl Conn<'_> {
    /// Reads until the buffer holds a whole head (after up to four empty lines,
    /// which are dropped). Ends on close, past the header-read timeout, on the
    /// listener's stop while waiting for a next request (for the first request of
    /// the connection: [`FIRST_REQUEST_GRACE`] after the stop, if no byte of it
    /// has come), on a line that does not end with CRLF, and on a head larger
    /// than [`MAX_HEAD`].
    pub(super) async fn read_head(&mut self, client: &mut impl Io) -> HeadRead {
        let mut scanned = 0;
        // From the first read on: a slow head does not move it.
        let mut deadline = None;
        loop {
            if scanned == 0 {
                match leading_empty_lines(&self.buf) {
                    Some(n) => self.buf.advance(n),
                    None => {
                        return HeadRead::Refused(Refusal::BadRequest(
                            "gov-agent: too many empty lines before the request\n",
                        ));
                    }
                }
            }
            match head_end(&self.buf, scanned, true) {
                Ok(Some(_)) => return HeadRead::Ready,
                Ok(None) => {}
                Err(refusal) => return HeadRead::Refused(refusal),
            }
            if self.buf.len() >= MAX_HEAD {
                return HeadRead::Refused(Refusal::HeadTooLarge);
            }
            scanned = self.buf.len().saturating_sub(3);
            // Waiting for a next request (nothing of it read yet) ends on stop; for
            // the first, the stop starts its grace instead.
            let idle = self.buf.is_empty();
            let watch_stop = idle && self.grace.is_none();
            self.buf.reserve(READ_CHUNK);
            let read = client.read_buf(&mut self.buf);
            let mut limit = self
                .cx
                .header_read_timeout
                .map(|limit| *deadline.get_or_insert_with(|| self.idle.arm_at_least(limit)));
            if let Some(grace) = self.grace.filter(|_| idle) {
                let at = limit.map_or(grace, |at| at.min(grace));
                self.idle.arm_before(at);
                limit = Some(at);
            }
            // `None`: the stop came. (`read_buf` is cancel safe: a branch that wins
            // leaves nothing read.)
            let n = match limit {
                None => tokio::select! {
                    n = read => Some(n),
                    () = &mut self.stopped, if watch_stop => None,
                },
                Some(at) => tokio::select! {
                    n = read => Some(n),
                    () = &mut self.stopped, if watch_stop => None,
                    () = self.idle.expired(at) => return HeadRead::Closed,
                },
            };
            let Some(n) = n else {
                if !self.first {
                    return HeadRead::Closed;
                }
                self.grace = Some(Instant::now() + FIRST_REQUEST_GRACE);
                continue;
            };
            match n {
                Ok(0) | Err(_) => return HeadRead::Closed,
                Ok(_) => {}
            }
        }
    }
}
