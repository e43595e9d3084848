//! The combining step of the `long double` reductions, in C (`long_double.c`, compiled by
//! `build.rs`): `long double` is the C compiler's type (x87 80-bit extended precision on
//! x86-64), which Rust has no arithmetic for. `collectives::reduce_long_double` moves the raw
//! 16-byte values with the runtime's gets and barriers; this combines them.

use std::ffi::c_int;

use hyper_multicore::shmem::ReduceOp;

/// The bytes of one C `long double` (checked by `long_double.c` at compile time).
pub(crate) const LONG_DOUBLE_BYTES: usize = 16;

extern "C" {
    /// `long_double.c`: folds `members` blocks of `nreduce` values at `parts` into `dest` with
    /// operator `op` (0 sum, 1 prod, 2 min, 3 max); -1 for another operator.
    fn hmshmem_long_double_combine(
        op: c_int,
        dest: *mut u8,
        parts: *const u8,
        members: usize,
        nreduce: usize,
    ) -> c_int;
}

/// The operators the standard defines for `long double` (sum, prod, min, max) by their number
/// in `long_double.c`; `None` for the bitwise ones.
fn operator(op: ReduceOp) -> Option<c_int> {
    match op {
        ReduceOp::Sum => Some(0),
        ReduceOp::Prod => Some(1),
        ReduceOp::Min => Some(2),
        ReduceOp::Max => Some(3),
        _ => None,
    }
}

/// `parts` (the members' `nreduce` values each, one member after the other) folded element-wise
/// with `op` in member order, as `nreduce` raw values; `None` for an operator `long double`
/// does not have.
pub(crate) fn combine(op: ReduceOp, parts: &[u8], nreduce: usize) -> Option<Vec<u8>> {
    let op = operator(op)?;
    let block = nreduce * LONG_DOUBLE_BYTES;
    assert!(
        block > 0 && parts.len() % block == 0 && !parts.is_empty(),
        "{} bytes are not whole blocks of {nreduce} long doubles",
        parts.len()
    );
    let mut dest = vec![0u8; block];
    // SAFETY: `dest` holds `nreduce` values and `parts` `members` blocks of `nreduce` values
    // (checked above); the C function reads and writes only those, copying values byte-wise
    // (no alignment needed), and keeps no pointer.
    let status = unsafe {
        hmshmem_long_double_combine(
            op,
            dest.as_mut_ptr(),
            parts.as_ptr(),
            parts.len() / block,
            nreduce,
        )
    };
    (status == 0).then_some(dest)
}
