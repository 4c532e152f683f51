//! Worker threads without work stealing. With `--worker-threads N` above 1,
//! each of N threads runs a runtime of its own (current-thread), and each
//! connection a proxy listener accepts is served whole on one of them, taken
//! in turn: its tasks (hyper's stream tasks, the bodies it relays, a call
//! held for a client that left) never move between threads, as an nginx
//! worker's connections never do. The agent's own tasks (the accept loops,
//! the control-plane stream, the admin listener, config swaps) stay on the
//! thread that started them.
//!
//! Upstream connections are kept per worker (`index`): a call goes out on
//! a connection its own thread reads and writes, not through another
//! thread's.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;

static WORKERS: OnceLock<Workers> = OnceLock::new();

struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

thread_local! {
    /// This thread's worker number, 1..=N; 0 on any other thread.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Starts `n` worker threads, each running its own runtime until the
/// process exits. Called once, before the listeners accept; a second call
/// starts nothing and says so.
pub fn start(n: usize) -> std::io::Result<()> {
    if WORKERS.get().is_some() {
        return Err(std::io::Error::other(
            "the worker threads were started already",
        ));
    }
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        handles.push(runtime.handle().clone());
        std::thread::Builder::new()
            .name(format!("gov-worker-{}", i + 1))
            .spawn(move || {
                INDEX.set(i + 1);
                runtime.block_on(std::future::pending::<()>());
            })?;
    }
    WORKERS
        .set(Workers {
            handles,
            next: AtomicUsize::new(0),
        })
        .map_err(|_| std::io::Error::other("the worker threads were started already"))
}

/// The worker the calling thread is (1..=N), 0 on any other thread: what
/// keeps upstream connections per worker.
pub(crate) fn index() -> usize {
    INDEX.get()
}

/// The next worker's runtime, in turn; `None` without worker threads (one
/// thread serves everything).
pub(crate) fn next() -> Option<&'static Handle> {
    let workers = WORKERS.get()?;
    let i = workers.next.fetch_add(1, Ordering::Relaxed) % workers.handles.len();
    workers.handles.get(i)
}
