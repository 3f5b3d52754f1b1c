//! Tracing events, captured so tests can see what the host and its guests logged (guest
//! events carry the service name in the `service` field): every event of the test process
//! ([`init`], then [`of`], [`count`], [`count_with`]), or those of one closure ([`capture`]).

use std::fmt::{Debug, Write as _};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{EnvFilter, Layer};

/// One captured event.
#[derive(Clone, Debug)]
pub struct Line {
    /// The `service` field, if any.
    pub service: Option<String>,
    /// The `stream` field (`stdout`/`stderr`) for guest output.
    pub stream: Option<String>,
    /// The message.
    pub message: String,
    /// Every other field, as ` name=value`.
    pub fields: String,
}

type Lines = Arc<Mutex<Vec<Line>>>;

/// What [`init`] captures: the events of every thread.
static LINES: LazyLock<Lines> = LazyLock::new(Lines::default);

/// A layer that appends every event it sees to its lines.
struct Capture(Lines);

fn lock(lines: &Lines) -> MutexGuard<'_, Vec<Line>> {
    lines.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
struct Fields {
    service: Option<String>,
    stream: Option<String>,
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "service" => self.service = Some(value.to_owned()),
            "stream" => self.stream = Some(value.to_owned()),
            "message" => value.clone_into(&mut self.message),
            other => {
                let _ = write!(self.rest, " {other}={value}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        match field.name() {
            "service" => self.service = Some(format!("{value:?}")),
            "message" => self.message = format!("{value:?}"),
            other => {
                let _ = write!(self.rest, " {other}={value:?}");
            }
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        lock(&self.0).push(Line {
            service: fields.service,
            stream: fields.stream,
            message: fields.message,
            fields: fields.rest,
        });
    }
}

/// Installs the capture (once per process); also prints events when `RUST_LOG` is set.
pub fn init() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let print = std::env::var("RUST_LOG").is_ok().then(|| {
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(EnvFilter::from_default_env())
        });
        let subscriber = tracing_subscriber::registry()
            .with(Capture(Arc::clone(&LINES)).with_filter(EnvFilter::new("vvm_host=trace")))
            .with(print);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
    });
}

/// Every event `f` logs on this thread (instead of the global subscriber of [`init`]).
pub fn capture(f: impl FnOnce()) -> Vec<Line> {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&lines)));
    tracing::subscriber::with_default(subscriber, f);
    lock(&lines).clone()
}

/// The lines [`init`] captured of `service`.
pub fn of(service: &str) -> Vec<Line> {
    lock(&LINES)
        .iter()
        .filter(|l| l.service.as_deref() == Some(service))
        .cloned()
        .collect()
}

/// How many lines of `service` contain `text` in their message.
pub fn count(service: &str, text: &str) -> usize {
    of(service)
        .iter()
        .filter(|l| l.message.contains(text))
        .count()
}

/// How many lines of `service` have the message `message` and a field `name=value` (as Debug).
pub fn count_with(service: &str, message: &str, field: &str) -> usize {
    of(service)
        .iter()
        .filter(|l| l.message.contains(message) && l.fields.contains(field))
        .count()
}
