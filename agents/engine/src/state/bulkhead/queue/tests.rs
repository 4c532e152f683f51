//! The queue disciplines and the shedding order, under paused time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use crate::config::invalid::Ctx;
use crate::criticality::Class;
use crate::primitive::{Answer, Primitive};
use crate::rejection::RejectReason;
use crate::state::bulkhead::queue::{QueueDiscipline, spec};
use crate::state::bulkhead::{Bulkhead, BulkheadKey, BulkheadScope, BulkheadSpec, CellRef};
use crate::state::keys::KeyCap;
use gov_proto::v1 as proto;

const MS: Duration = Duration::from_millis(1);

fn bulkhead(
    wait_ms: u64,
    max_queue: Option<u32>,
    queue: QueueDiscipline,
    by_class: bool,
) -> Arc<Bulkhead> {
    Arc::new(Bulkhead::new(BulkheadSpec {
        key: BulkheadKey::Operation,
        max_concurrent: 1,
        max_wait: Duration::from_millis(wait_ms),
        max_queue,
        timeout: None,
        reject_status: StatusCode::REQUEST_TIMEOUT,
        reject_grpc: proto::GrpcCode::Unavailable,
        keys: KeyCap::default(),
        adaptive: None,
        share: None,
        queue,
        by_class,
    }))
}

fn codel() -> QueueDiscipline {
    QueueDiscipline::Codel {
        target: 5 * MS,
        interval: 100 * MS,
    }
}

/// The one permit, taken now.
fn hold(b: &Bulkhead) {
    assert!(b.try_take(b.cell(&CellRef::Single)));
}

fn give(b: &Bulkhead) {
    b.give(b.cell(&CellRef::Single));
}

/// A call of `class` that waits now: its answer and how long it waited.
fn waiter(
    b: &Arc<Bulkhead>,
    class: Class,
) -> tokio::task::JoinHandle<(Result<(), RejectReason>, Duration)> {
    let b = b.clone();
    tokio::spawn(async move {
        let start = Instant::now();
        let r = b.wait_as(b.cell(&CellRef::Single), class).await;
        (r, start.elapsed())
    })
}

/// Calls that arrive `gap` apart, each served for `hold` once granted:
/// the order they were served in.
async fn served_order(
    b: &Arc<Bulkhead>,
    classes: &[Class],
    gap: Duration,
    first_release: Duration,
    hold: Duration,
) -> Vec<usize> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for (n, &class) in classes.iter().enumerate() {
        let (b, order) = (b.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            b.wait_as(b.cell(&CellRef::Single), class).await.unwrap();
            order.lock().unwrap().push(n);
            tokio::time::sleep(hold).await;
            b.give(b.cell(&CellRef::Single));
        }));
        tokio::time::sleep(gap).await;
    }
    tokio::time::sleep_until(start + first_release).await;
    give(b);
    for t in tasks {
        t.await.unwrap();
    }
    order.lock().unwrap().clone()
}

/// CoDel: a queue that empties within `interval` (a burst) waits up to
/// `max_wait`; once it has stood for `interval`, a call is refused after
/// waiting `target`.
#[tokio::test(start_paused = true)]
async fn codel_refuses_after_target_once_the_queue_has_stood() {
    let b = bulkhead(1000, None, codel(), false);
    hold(&b);
    let t0 = Instant::now();
    let first = waiter(&b, Class::Default);
    tokio::time::sleep_until(t0 + 98 * MS).await;
    let second = waiter(&b, Class::Default);
    tokio::time::sleep_until(t0 + 101 * MS).await;
    let third = waiter(&b, Class::Default);
    // The queue has stood since 0: its interval ends at 100ms.
    let timeout = Err(RejectReason::BulkheadTimeout);
    assert_eq!(first.await.unwrap(), (timeout, 100 * MS));
    // Joined at 98ms: waits to 103ms (the target), past the interval's end.
    assert_eq!(second.await.unwrap(), (timeout, 5 * MS));
    // Joined a standing queue: the target.
    assert_eq!(third.await.unwrap(), (timeout, 5 * MS));
    assert_eq!(
        b.counters
            .waiting
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    // Empty again: a new queue stands only `interval` from now, and a
    // release within it serves the waiter.
    tokio::time::sleep(50 * MS).await;
    let burst = waiter(&b, Class::Default);
    tokio::time::sleep(60 * MS).await;
    give(&b);
    assert_eq!(burst.await.unwrap(), (Ok(()), 60 * MS));
    assert_eq!(b.in_use(), 1);
}

/// Adaptive LIFO: first come, first served while the queue is young, last
/// come, first served once it has stood for `interval`.
#[tokio::test(start_paused = true)]
async fn lifo_serves_the_newest_once_the_queue_has_stood() {
    let lifo = QueueDiscipline::Lifo { interval: 100 * MS };
    let b = bulkhead(10_000, None, lifo, false);
    hold(&b);
    // Arrive at 0, 10, .., 40; the first release at 50 (queue stood 50ms):
    // FIFO, the oldest. The next at 150: it has stood, LIFO from the newest.
    let d = Class::Default;
    let order = served_order(&b, &[d; 5], 10 * MS, 50 * MS, 100 * MS).await;
    assert_eq!(order, [0, 4, 3, 2, 1]);
    assert_eq!(b.in_use(), 0);
}

/// FIFO with classes: critical waiters are served before default ones,
/// each class in arrival order.
#[tokio::test(start_paused = true)]
async fn critical_calls_are_served_first() {
    let b = bulkhead(1000, None, QueueDiscipline::Fifo, true);
    hold(&b);
    let (d, c) = (Class::Default, Class::Critical);
    let order = served_order(&b, &[d, c, d, c], 10 * MS, 50 * MS, 10 * MS).await;
    assert_eq!(order, [1, 3, 0, 2]);
}

/// A sheddable call fails fast where a default one waits, and a free
/// permit serves either.
#[tokio::test(start_paused = true)]
async fn sheddable_calls_fail_fast_under_contention() {
    let b = bulkhead(1000, None, QueueDiscipline::Fifo, true);
    let scope = |class| BulkheadScope {
        cell: CellRef::Single,
        class,
    };
    let now = Instant::now();
    let free = b.try_acquire(Some(&scope(Class::Sheddable)), now.into(), now.into());
    assert!(matches!(free, Answer::Granted(_)));
    let shed = b.try_acquire(Some(&scope(Class::Sheddable)), now.into(), now.into());
    assert_eq!(shed, Answer::Refused(RejectReason::BulkheadFull, None));
    let wait = b.try_acquire(Some(&scope(Class::Default)), now.into(), now.into());
    assert_eq!(wait, Answer::Wait(Duration::from_secs(1)));
    let start = Instant::now();
    assert_eq!(
        b.acquire(Some(&scope(Class::Sheddable)), start).await,
        Err((RejectReason::BulkheadFull, None))
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// A critical call that finds the queue full displaces the newest lower
/// waiter, which is refused at once; with none to displace it is refused.
#[tokio::test(start_paused = true)]
async fn a_critical_call_displaces_a_lower_waiter_from_a_full_queue() {
    let b = bulkhead(1000, Some(2), QueueDiscipline::Fifo, true);
    hold(&b);
    let old = waiter(&b, Class::Default);
    tokio::time::sleep(MS).await;
    let newer = waiter(&b, Class::Default);
    tokio::time::sleep(MS).await;
    let critical = waiter(&b, Class::Critical);
    tokio::time::sleep(MS).await;
    assert_eq!(
        newer.await.unwrap(),
        (Err(RejectReason::BulkheadFull), MS),
        "the newest default waiter makes room"
    );
    let second = waiter(&b, Class::Critical);
    tokio::time::sleep(MS).await;
    assert_eq!(
        old.await.unwrap(),
        (Err(RejectReason::BulkheadFull), 3 * MS)
    );
    // Two critical waiters fill the queue: a third call is refused.
    let start = Instant::now();
    assert_eq!(
        b.wait_as(b.cell(&CellRef::Single), Class::Critical).await,
        Err(RejectReason::BulkheadFull)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    give(&b);
    assert_eq!(critical.await.unwrap(), (Ok(()), 2 * MS));
    give(&b);
    assert_eq!(second.await.unwrap(), (Ok(()), MS));
    assert_eq!(b.cell(&CellRef::Single).ordered.waiting(), 0);
}

/// A waiter that goes away leaves the queue; one handed a permit it never
/// took gives the permit back, to the next waiter or to newcomers.
#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_gives_back_what_it_was_handed() {
    let b = bulkhead(1000, None, codel(), false);
    hold(&b);
    let cell = b.cell(&CellRef::Single);
    {
        let w = b.wait_as(cell, Class::Default);
        tokio::pin!(w);
        assert!(
            tokio::time::timeout(Duration::ZERO, w.as_mut())
                .await
                .is_err()
        );
        give(&b);
        assert_eq!(b.in_use(), 1, "handed to the waiter");
    }
    assert_eq!(b.in_use(), 0, "given back when the waiter left");
    assert_eq!(cell.ordered.waiting(), 0);
    assert!(b.try_take(cell), "a newcomer takes it");
    {
        let w = b.wait_as(cell, Class::Default);
        tokio::pin!(w);
        assert!(
            tokio::time::timeout(Duration::ZERO, w.as_mut())
                .await
                .is_err()
        );
    }
    assert_eq!(cell.ordered.waiting(), 0);
    give(&b);
    assert!(b.try_take(cell), "no waiter counted any more");
}

#[test]
fn the_wire_queue_is_checked() {
    let ctx = Ctx::new("order/b");
    let q = |kind| proto::Queue { kind };
    use proto::queue::Kind;
    assert_eq!(spec(&ctx, None).unwrap(), QueueDiscipline::Fifo);
    assert!(spec(&ctx, Some(&q(None))).is_err(), "no discipline");
    let codel = |target_ms, interval_ms| {
        q(Some(Kind::Codel(proto::QueueCodel {
            target_ms,
            interval_ms,
        })))
    };
    assert_eq!(spec(&ctx, Some(&codel(5, 100))).unwrap(), self::codel());
    assert!(spec(&ctx, Some(&codel(0, 100))).is_err());
    assert!(spec(&ctx, Some(&codel(100, 100))).is_err());
    assert!(spec(&ctx, Some(&codel(5, 0))).is_err());
    let lifo = |interval_ms| q(Some(Kind::Lifo(proto::QueueLifo { interval_ms })));
    assert!(spec(&ctx, Some(&lifo(0))).is_err());
    assert_eq!(
        spec(&ctx, Some(&lifo(50))).unwrap(),
        QueueDiscipline::Lifo { interval: 50 * MS }
    );
}
