//! `.lct` trace files as LMCache records them (`lmcache server
//! --trace-level events`), read for replay into a coordinator and written
//! by tests.
//!
//! On disk a trace is a run of frames; each frame is a 4-byte big-endian
//! length followed by that many bytes holding one msgpack value. Every
//! value is a map carrying a `type` discriminator (msgspec's tagged-struct
//! encoding):
//!
//! * the first frame is the header (`type = "header"`): `magic` (bin,
//!   `LMCT`), `format_version` (1), `level` (`"events"` for coordinator
//!   traces), `trace_schema_version` (1 or 2), `level_meta`,
//!   `lmcache_version`, `t_mono_start`, `t_wall_start`, `sm_config_json`,
//!   `sm_config_digest`;
//! * every later frame is a record (`type = "record"`): `t_mono` (seconds
//!   since `t_mono_start`), `t_wall`, `qualname` and an `args` map.
//!
//! The recorder omits fields equal to their default, so any field may be
//! missing and takes its default here; fields this build does not know are
//! ignored. A present `magic` or `format_version` with the wrong value is
//! refused, as is a level other than `events`.
//!
//! Two qualnames matter for replay: `events.batch`, whose `args` are one
//! `CacheEventBatch` in its `POST /events` form, and `events.lifecycle`,
//! whose `args` hold a `phase` (`register`, `heartbeat`, `deregister`) and
//! the instance fields. Anything else is surfaced as a [`Skipped`] item so
//! callers can count it.
//!
//! Layout: `format` holds the schema (the constants, [`Header`], [`Record`],
//! [`TraceError`]), `frame` the length-prefixed msgpack frames and their
//! JSON conversion, `read` and `write` the two directions, and `replay` what
//! a record means to a coordinator ([`TraceEvent`]) and when it is due.

mod format;
mod frame;
mod read;
mod replay;
mod write;

#[cfg(test)]
mod tests;

pub use format::{
    EVENTS_LEVEL, FORMAT_VERSION, Header, MAX_FRAME_BYTES, QUALNAME_BATCH, QUALNAME_LIFECYCLE,
    READABLE_SCHEMA_VERSIONS, Record, TRACE_MAGIC, TraceError, WRITTEN_SCHEMA_VERSION,
};
pub use frame::write_raw_frame;
pub use read::TraceReader;
pub use replay::{LifecyclePhase, REGISTRATION_FIELDS, Skipped, TraceEvent, due_after};
pub use write::TraceWriter;
