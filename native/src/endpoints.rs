//! Does a Produce (v10-12) or Fetch (v16-18) answer name brokers? Read in place, so that one that does not
//! passes untouched.
//!
//! From these versions (KIP-951) a broker may add the new leaders' addresses to its answer (the top-level
//! tagged field NodeEndpoints, only beside NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH errors); the proxy must
//! put its own listeners there. This walks the answer with bounds: every length and count checked against the
//! end before use, records skipped by their length, nothing built. `true` only when the whole answer was read
//! and its top-level tagged fields are empty; anything else (addresses present, any top-level tag, a shape or
//! version not read here, a length past the end) is `false`, and kio reads the answer.

use crate::bytes::{Bytes, Cursor};
use crate::compact::{count, skip_bytes, skip_tags};

pub const PRODUCE: i16 = 0;
pub const FETCH: i16 = 1;
// Produce: index, error code, base offset, log append time, log start offset.
const PRODUCE_PARTITION: usize = 4 + 2 + 8 + 8 + 8;
// Fetch: index, error code, high watermark, last stable offset, log start offset.
const FETCH_PARTITION: usize = 4 + 2 + 8 + 8 + 8;
const FETCH_TOP: usize = 4 + 2 + 4; // throttle time, error code, session id
const UUID: usize = 16;

/// The versions walked: from the first with NodeEndpoints to the last whose layout is the one below (Produce
/// v13 names topics by id: kio reads it).
pub fn read_here(key: i16, version: i16) -> bool {
    match key {
        PRODUCE => (10..13).contains(&version),
        FETCH => (16..19).contains(&version),
        _ => false,
    }
}

/// NodeEndpoints is tag 0; any tag at all goes to kio. Exactly one byte, a zero, must be left.
fn top_level_tags_empty<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<bool> {
    Some(c.left() == 1 && c.u8()? == 0)
}

fn produce<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<bool> {
    c.skip(4)?; // the correlation id
    skip_tags(c)?; // the response header's
    for _ in 0..count(c, 3, false)? {
        skip_bytes(c)?; // the topic's name
        for _ in 0..count(c, PRODUCE_PARTITION as u64 + 3, false)? {
            c.skip(PRODUCE_PARTITION)?;
            for _ in 0..count(c, 6, false)? {
                c.skip(4)?; // batch index
                skip_bytes(c)?; // its error message
                skip_tags(c)?;
            }
            skip_bytes(c)?; // the partition's error message
            skip_tags(c)?; // CurrentLeader (an id and an epoch, no address)
        }
        skip_tags(c)?;
    }
    c.skip(4)?; // the throttle time
    top_level_tags_empty(c)
}

fn fetch<B: Bytes + ?Sized>(c: &mut Cursor<'_, B>) -> Option<bool> {
    c.skip(4)?; // the correlation id
    skip_tags(c)?;
    c.skip(FETCH_TOP)?;
    for _ in 0..count(c, UUID as u64 + 2, false)? {
        c.skip(UUID)?;
        for _ in 0..count(c, FETCH_PARTITION as u64 + 7, false)? {
            c.skip(FETCH_PARTITION)?;
            for _ in 0..count(c, 17, true)? {
                c.skip(16)?; // producer id, first offset
                skip_tags(c)?;
            }
            c.skip(4)?; // the preferred read replica
            skip_bytes(c)?; // the records
            skip_tags(c)?; // diverging epoch, current leader, snapshot id: no address
        }
        skip_tags(c)?;
    }
    top_level_tags_empty(c)
}

/// `buf[start..stop]`: the answer from its correlation id on (the frame without its length prefix).
pub fn endpoints_absent<B: Bytes + ?Sized>(buf: &B, start: usize, stop: usize, key: i16, version: i16) -> bool {
    if !read_here(key, version) {
        return false;
    }
    let Some(mut c) = Cursor::new(buf, start, stop) else { return false };
    let walked = if key == PRODUCE { produce(&mut c) } else { fetch(&mut c) };
    walked.unwrap_or(false)
}
