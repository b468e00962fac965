//! leaderrun: run a command only while this process holds a lease.
//!
//! The library is the whole program; `main.rs` only calls [`entry::main_entry`] (or the watchdog's or
//! `--generate`'s own `main`).
//! The elector and the stores are usable on their own.

pub mod admin;
pub mod cli;
pub mod clock;
pub mod duration;
pub mod elector;
pub mod entry;
pub mod error;
pub mod exit;
pub mod fork;
pub mod generate;
pub mod logging;
pub mod names;
pub mod published;
pub mod redact;
pub mod report;
pub mod run;
pub mod signals;
pub mod stderr;
pub mod stop;
pub mod store;
pub mod supervisor;
pub mod terminal;
pub mod timing;
pub mod tree;
pub mod watch;
pub mod watchdog;
