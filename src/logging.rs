//! Logs go to stderr, one line per event.
//!
//! The default level is WARN: a healthy try-once run under cron prints
//! nothing, so cron mails only when something deserves a look (a lost lease,
//! renew trouble, a failure). `-v` adds the lifecycle (acquired, released,
//! held by whom), which is what a systemd journal wants; `-vv` adds every
//! renewal. `-q` keeps only errors.
//!
//! Every line carries a stable `event` name (documented in docs/guide.md);
//! `--log-format json` writes each as one JSON object with `time`, `level`,
//! `event`, `name`, `epoch`, `holder` and `message`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::OnceLock;

use serde::ser::{Serialize, Serializer};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Lease name and holder id, the same for every line of one process.
static CONTEXT: OnceLock<(String, String)> = OnceLock::new();

pub fn set_context(name: &str, holder: &str) {
    let _ = CONTEXT.set((name.to_string(), holder.to_string()));
}

/// The context's name and holder; a subcommand has no holder of its own,
/// which its JSON lines say as `null`, as every other unknown value.
fn context() -> (Option<&'static str>, Option<&'static str>) {
    match CONTEXT.get() {
        Some((n, h)) => (Some(n.as_str()), Some(h.as_str()).filter(|h| !h.is_empty())),
        None => (None, None),
    }
}

/// The epoch this process holds, once it holds one: lines about the
/// command (`kill`, `signal`, `group_swept`, …) are about that grant, and a
/// reader filtering by epoch must see them without every call site naming
/// it. An event's own `epoch` field wins.
static EPOCH: AtomicI64 = AtomicI64::new(NO_EPOCH);
const NO_EPOCH: i64 = i64::MIN;

pub fn set_epoch(epoch: i64) {
    EPOCH.store(epoch, Ordering::Relaxed);
}

fn held_epoch() -> Option<i64> {
    Some(EPOCH.load(Ordering::Relaxed)).filter(|e| *e != NO_EPOCH)
}

/// How log lines are written on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

/// What `-v`, `-q` and `--log-format` asked for: leaderrun and its watchdog
/// log alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    pub verbose: u8,
    pub quiet: bool,
    pub format: LogFormat,
}

/// Whether lines are JSON: set once, by [`init`] or [`set_format`].
static JSON: AtomicBool = AtomicBool::new(false);

/// `-q`: a subcommand's "no" goes unsaid (its exit status says it).
static QUIET: AtomicBool = AtomicBool::new(false);

/// The format for [`say`] when [`init`] is not called: a command line that
/// clap refused still says why in the format it asked for.
pub fn set_format(format: LogFormat) {
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
}

pub fn init(s: Settings) {
    let Settings {
        verbose,
        quiet,
        format,
    } = s;
    set_format(format);
    QUIET.store(quiet, Ordering::Relaxed);
    let level = match (quiet, verbose) {
        (true, _) => Level::ERROR,
        (false, 0) => Level::WARN,
        (false, 1) => Level::INFO,
        (false, _) => Level::DEBUG,
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(crate::stderr::MakeWriter)
        .with_max_level(level)
        .event_format(Line {
            json: format == LogFormat::Json,
        })
        .try_init();
}

/// A line that answers or refuses on its own (a subcommand's "no", a
/// refused command line, a store that cannot be opened): written whatever
/// `-v` says, and under `-q` only at ERROR (a refusal: the "no" of an
/// answer is in the exit status), as `leaderrun: <message>` (`leaderrun:
/// error: <message>` at ERROR) or, with `--log-format json`, as an event
/// shaped like every other line.
pub fn say(level: Level, event: &str, message: &str) {
    if level != Level::ERROR && QUIET.load(Ordering::Relaxed) {
        return;
    }
    let line = if JSON.load(Ordering::Relaxed) {
        let mut time = String::new();
        let _ = SystemTime.format_time(&mut Writer::new(&mut time));
        let (name, holder) = context();
        let line = JsonLine {
            time: &time,
            level: &level.as_str().to_ascii_lowercase(),
            event,
            name,
            epoch: held_epoch(),
            holder,
            message,
            extra: Extra(&[]),
        };
        match serde_json::to_string(&line) {
            Ok(l) => l,
            // Strings and integers under string keys cannot fail to
            // serialize; were it to happen, the reader still gets JSON.
            Err(_) => r#"{"level":"error","event":"log_failed"}"#.to_string(),
        }
    } else if level == Level::ERROR {
        format!("leaderrun: error: {message}")
    } else {
        format!("leaderrun: {message}")
    };
    crate::stderr::write(format!("{line}\n").into_bytes());
}

/// Keys every JSON line has; an event field of the same name is dropped.
const STANDARD: [&str; 7] = [
    "time", "level", "event", "name", "epoch", "holder", "message",
];

struct Line {
    json: bool,
}

/// The fields of one event, collected.
#[derive(Default)]
struct Fields {
    message: String,
    event: Option<String>,
    epoch: Option<i64>,
    rest: Vec<(&'static str, Value)>,
}

/// An extra field's value: numbers stay numbers in JSON (`"pid":812`).
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Value {
    Int(i64),
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Text(s) => f.write_str(s),
        }
    }
}

/// One JSON log line: the standard keys in this order, always present
/// (`null` when unknown), then the event's own fields, still flat.
/// serde_json escapes every control character, so a line is one line
/// whatever a message or a holder holds.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    time: &'a str,
    level: &'a str,
    event: &'a str,
    name: Option<&'a str>,
    epoch: Option<i64>,
    holder: Option<&'a str>,
    message: &'a str,
    #[serde(flatten)]
    extra: Extra<'a>,
}

/// The event's own fields, minus any that would repeat a standard key.
struct Extra<'a>(&'a [(&'static str, Value)]);

impl Serialize for Extra<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(
            self.0
                .iter()
                .filter(|(k, _)| !STANDARD.contains(k))
                .map(|(k, v)| (k, v)),
        )
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "event" => self.event = Some(format!("{value:?}").trim_matches('"').to_string()),
            other => self.rest.push((other, Value::Text(format!("{value:?}")))),
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "event" => self.event = Some(value.to_string()),
            other => self.rest.push((other, Value::Text(value.to_string()))),
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        match field.name() {
            "epoch" => self.epoch = Some(value),
            other => self.rest.push((other, Value::Int(value))),
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record_i64(field, i64::try_from(value).unwrap_or(i64::MAX));
    }
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut f = Fields::default();
        event.record(&mut f);
        f.epoch = f.epoch.or_else(held_epoch);
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let level = event.metadata().level();
        let (name, holder) = context();
        if self.json {
            let line = JsonLine {
                time: &time,
                level: &level.as_str().to_ascii_lowercase(),
                event: f.event.as_deref().unwrap_or("log"),
                name,
                epoch: f.epoch,
                holder,
                message: &f.message,
                extra: Extra(&f.rest),
            };
            let line = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
            writeln!(w, "{line}")
        } else {
            write!(w, "{time} {level:>5} {}", f.message)?;
            if let Some(e) = f.epoch {
                write!(w, " epoch={e}")?;
            }
            for (k, v) in &f.rest {
                write!(w, " {k}={v}")?;
            }
            writeln!(w)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes a log reader parses: standard keys first and always
    /// there, numbers as numbers, an extra field that repeats a standard
    /// key dropped, every control character escaped.
    #[test]
    fn a_json_line_keeps_its_shape() {
        let rest = [
            ("pid", Value::Int(812)),
            ("name", Value::Text("not the lease".into())),
            ("signal", Value::Text("SIGTERM".into())),
        ];
        let line = JsonLine {
            time: "2026-01-02T03:04:05.000006Z",
            level: "warn",
            event: "kill",
            name: Some("job"),
            epoch: None,
            holder: Some("h\"1"),
            message: "x\"y\\z\n\r\t\u{1}\u{1f}é",
            extra: Extra(&rest),
        };
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            r#"{"time":"2026-01-02T03:04:05.000006Z","level":"warn","event":"kill","name":"job","epoch":null,"holder":"h\"1","message":"x\"y\\z\n\r\t\u0001\u001fé","pid":812,"signal":"SIGTERM"}"#
        );
    }
}
