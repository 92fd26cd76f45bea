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
use crate::compact::{count, skip_bytes, skip_tags, skip_tags_known};

pub const PRODUCE: i16 = 0;
pub const FETCH: i16 = 1;
// Produce: index, error code, base offset, log append time, log start offset.
const PRODUCE_PARTITION: usize = 4 + 2 + 8 + 8 + 8;
// Fetch: index, error code, high watermark, last stable offset, log start offset.
const FETCH_PARTITION: usize = 4 + 2 + 8 + 8 + 8;
const FETCH_TOP: usize = 4 + 2 + 4; // throttle time, error code, session id
const UUID: usize = 16;
/// A Produce answer's partition tags: 0 CurrentLeader (leader id, leader epoch).
const PRODUCE_PARTITION_TAGS: &[(u64, usize)] = &[(0, 4 + 4)];
/// A Fetch answer's partition tags (v12 on): 0 DivergingEpoch (epoch, end offset), 1 CurrentLeader (leader id,
/// leader epoch), 2 SnapshotId (end offset, epoch).
pub const FETCH_PARTITION_TAGS: &[(u64, usize)] = &[(0, 4 + 8), (1, 4 + 4), (2, 8 + 4)];

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
            skip_tags_known(c, PRODUCE_PARTITION_TAGS)?; // CurrentLeader (an id and an epoch, no address)
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
            skip_tags_known(c, FETCH_PARTITION_TAGS)?; // diverging epoch, current leader, snapshot id: no address
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

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// Found by the property test: a Produce v10 answer whose CurrentLeader tag holds its two fields and a
    /// tagged-fields count of 1 with no bytes after it. Skipping the tag by its size, the walker took it for
    /// whole; kio reads the known tag and refuses it: so must the walker.
    #[test]
    fn a_known_tag_that_does_not_parse_is_left_to_kio() {
        let broken = unhex("0000002a00032f30303030c280c280c280c280c280f0908080f0908080f0908080f0908080f0908080f0908080f0908080f09080800100043030300300000000ffff0000000000000000ffffffffffffffffffffffffffffffff03000000000000000000000000000000000000ffff0000000000000000ffffffffffffffffffffffffffffffff011130303030c280c280c280c280f0908080010009ffffffff0000000001000000000000");
        assert!(!endpoints_absent(broken.as_slice(), 0, broken.len(), PRODUCE, 10));
        // The same answer with the inner count 0: whole, no broker named.
        let mut whole = broken.clone();
        let at = whole.len() - 7; // the inner count; then the topic's tags, the throttle time, the top-level tags
        assert_eq!(whole[at], 1);
        whole[at] = 0;
        assert!(endpoints_absent(whole.as_slice(), 0, whole.len(), PRODUCE, 10));
    }
}
