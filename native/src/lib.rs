//! txnguard's native data path (`txnguard._native`): the readers of the relay's fast path.
//!
//! Everything here reads bytes a client sent, which may be hostile: every read is bounds-checked
//! (`bytes.rs`), nothing here uses `unsafe`, and a panic (a bug, never an input's fault) reaches Python as
//! `PanicException`, which the connection core catches to close only that connection.

#![forbid(unsafe_code)]

pub mod bytes;
pub mod produce;

use pyo3::buffer::PyBuffer;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// (transactional id, producer id, producer epoch, [(topic, partition)], acks)
type Write = (String, i64, i16, Vec<(String, i32)>, i16);

/// `scan_transactional(data, start, stop, flexible)`: the transactional Produce whose body runs from its
/// transactional id at `start` to the frame's end at `stop` in `data` (any contiguous buffer: the socket's
/// read, never copied), or None when the fast path must leave it to the general path.
#[pyfunction]
fn scan_transactional(data: &Bound<'_, PyAny>, start: usize, stop: usize, flexible: bool)
    -> PyResult<Option<Write>> {
    let pack = |w: produce::TransactionalWrite| {
        (w.transactional_id, w.producer_id, w.producer_epoch, w.partitions, w.acks)
    };
    // The socket's reads are `bytes`: read as a plain slice (no buffer protocol round trip).
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return Ok(produce::scan_transactional(bytes.as_bytes(), start, stop, flexible).map(pack));
    }
    let buffer = PyBuffer::<u8>::get(data)?;
    let Some(cells) = buffer.as_slice(data.py()) else {
        return Ok(None); // not contiguous: the general path
    };
    Ok(produce::scan_transactional(cells, start, stop, flexible).map(pack))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scan_transactional, m)?)?;
    m.add("PanicException", m.py().get_type::<PanicException>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
