//! Element-wise combines whose second operand is read straight from a shared mapping: a
//! reduction combines each member's source where it lies, without first copying it into a
//! private buffer (one load per element instead of a copy and a load).
//!
//! The operand is never a slice: other processes may write those bytes while they are read, so
//! each element is one raw, unaligned load of plain data (any bit pattern is a valid `T`; a
//! concurrent writer can only make it stale or torn), as `sys/mapping.rs` copies bytes.

use super::mapping::SharedMapping;

/// `into[i] = f(into[i], other[i])` for every element, `other` being the `into.len()` elements
/// of `T` at byte `offset` of `mapping` (panics if they are not inside it). One loop with
/// nothing else in it, for the compiler to vectorise.
#[inline]
pub(crate) fn zip_with_mapped<T: bytemuck::Pod>(
    into: &mut [T],
    mapping: &SharedMapping,
    offset: usize,
    f: impl Fn(T, T) -> T,
) {
    let bytes = std::mem::size_of_val(into);
    let Some(start) = mapping.range_address(offset, bytes) else {
        panic!("elements {offset}+{bytes} outside the mapping");
    };
    let other = start.cast_const().cast::<T>();
    for (i, a) in into.iter_mut().enumerate() {
        // SAFETY: element `i` lies inside the mapping (checked above for all of them), which
        // stays mapped while `mapping` is borrowed; an unaligned read of plain data that other
        // processes may write meanwhile (see the module documentation); no reference to it is
        // formed.
        let b = unsafe { other.add(i).read_unaligned() };
        *a = f(*a, b);
    }
}

/// `into[i] = f(a[i], b[i])` for every element, `a` and `b` being the `into.len()` elements of
/// `T` at byte offsets `first` and `second` of `mapping` (panics if they are not inside it):
/// the first two members' values combined in one pass, neither copied first.
#[inline]
pub(crate) fn zip2_with_mapped<T: bytemuck::Pod>(
    into: &mut [T],
    mapping: &SharedMapping,
    [first, second]: [usize; 2],
    f: impl Fn(T, T) -> T,
) {
    let bytes = std::mem::size_of_val(into);
    let (Some(a), Some(b)) = (
        mapping.range_address(first, bytes),
        mapping.range_address(second, bytes),
    ) else {
        panic!("elements {first}+{bytes} or {second}+{bytes} outside the mapping");
    };
    let (a, b) = (a.cast_const().cast::<T>(), b.cast_const().cast::<T>());
    for (i, into) in into.iter_mut().enumerate() {
        // SAFETY: element `i` of both ranges lies inside the mapping (checked above for all of
        // them), which stays mapped while `mapping` is borrowed; unaligned reads of plain data
        // that other processes may write meanwhile (see the module documentation); no
        // reference to either is formed.
        let (x, y) = unsafe { (a.add(i).read_unaligned(), b.add(i).read_unaligned()) };
        *into = f(x, y);
    }
}
