//! Handles to symmetric allocations and their sub-range views.
//!
//! An [`Allocation<T>`] owns one block of the symmetric heap: the same offset on every PE, typed
//! over a plain-old-data element type. It is not `Clone`; [`crate::shmem::Shmem::free`] consumes
//! it, so a use after free does not compile. A [`View`] is a sub-range of an allocation usable
//! as an RMA target; it borrows the allocation and can never be freed on its own. Every handle
//! carries an [`AllocationId`] — (id, runtime generation) — so a handle from an earlier runtime
//! lifetime is rejected at run time.
//!
//! ```no_run
//! # fn demo(shmem: &hyper_multicore::shmem::Shmem) -> hyper_multicore::Result<()> {
//! let buffer = shmem.allocate::<f32>(1024, None)?;
//! let second_half = buffer.view(512..)?;
//! shmem.put(&second_half, &[1.0; 512], 1)?;
//! shmem.free(buffer)?;
//! # Ok(()) }
//! ```

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// Identifies one allocation of one runtime lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AllocationId {
    /// Sequence number of the allocation in its lifetime (the same on every PE).
    pub index: u64,
    /// The runtime lifetime (generation) it belongs to.
    pub generation: u64,
}

/// Element types a symmetric allocation can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Dtype {
    /// `bool` as one byte.
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`.
    U16,
    /// `i16`.
    I16,
    /// IEEE half precision (stored as 2 bytes).
    F16,
    /// bfloat16 (stored as 2 bytes).
    BF16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `f32`.
    F32,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// `f64`.
    F64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// Lower-case name, as torch spells it (`"float32"`, `"bfloat16"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::U8 => "uint8",
            Dtype::I8 => "int8",
            Dtype::U16 => "uint16",
            Dtype::I16 => "int16",
            Dtype::F16 => "float16",
            Dtype::BF16 => "bfloat16",
            Dtype::U32 => "uint32",
            Dtype::I32 => "int32",
            Dtype::F32 => "float32",
            Dtype::U64 => "uint64",
            Dtype::I64 => "int64",
            Dtype::F64 => "float64",
        }
    }

    /// Every dtype.
    pub const ALL: [Dtype; 13] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::U16,
        Dtype::I16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::U32,
        Dtype::I32,
        Dtype::F32,
        Dtype::U64,
        Dtype::I64,
        Dtype::F64,
    ];

    /// The dtype named `name` (as [`Dtype::name`] spells it).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// A Rust element type that may live in the symmetric heap.
pub trait Element: bytemuck::Pod + Send + Sync {
    /// Its dtype.
    const DTYPE: Dtype;
}

macro_rules! elements {
    ($($ty:ty => $dtype:ident),* $(,)?) => {
        $(impl Element for $ty { const DTYPE: Dtype = Dtype::$dtype; })*
    };
}
elements!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32, u64 => U64, i64 => I64, f64 => F64);

/// What to allocate, independent of a Rust type: shape, dtype and alignment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocationSpec {
    /// Dimensions; the element count is their product.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: Dtype,
    /// Alignment in bytes (`None` = the default, 64); a power of two otherwise.
    pub alignment: Option<u64>,
}

impl AllocationSpec {
    /// A one-dimensional spec of `len` elements of `T`.
    pub fn of<T: Element>(len: usize, alignment: Option<u64>) -> AllocationSpec {
        AllocationSpec {
            shape: vec![len],
            dtype: T::DTYPE,
            alignment,
        }
    }

    /// Element count, or an error if it overflows.
    pub fn elements(&self) -> Result<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    "allocate",
                    format!(
                        "shape {:?} has more elements than fit in memory",
                        self.shape
                    ),
                )
            })
    }

    /// Bytes, or an error if it overflows.
    pub fn bytes(&self) -> Result<u64> {
        let bytes = self.elements()?.checked_mul(self.dtype.size());
        bytes.map(|b| b as u64).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                "allocate",
                format!(
                    "shape {:?} of {} is too large",
                    self.shape,
                    self.dtype.name()
                ),
            )
        })
    }
}

/// Everything the runtime records about one live allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationRecord {
    /// Its id.
    pub id: AllocationId,
    /// Offset from the start of every PE's heap.
    pub offset: u64,
    /// Bytes requested (shape × dtype size).
    pub bytes: u64,
    /// Alignment honoured.
    pub alignment: u64,
    /// What was asked for.
    pub spec: AllocationSpec,
}

impl AllocationRecord {
    /// The whole allocation as a byte range (what the data plane and a restart's
    /// [`Replacement`](crate::lifecycle::Replacement) take).
    pub fn region(&self) -> Region {
        Region {
            id: self.id,
            heap_offset: self.offset,
            bytes: self.bytes,
        }
    }

    /// The typed, owning handle of this allocation, if its dtype is `T`'s (e.g. a record a
    /// restart returned). Make one handle per allocation: freeing it consumes it, and a second
    /// handle of the same allocation is rejected as freed.
    pub fn into_allocation<T: Element>(self) -> Result<Allocation<T>> {
        if self.spec.dtype != T::DTYPE {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "allocation handle",
                format!(
                    "allocation {} holds {} but a handle of {} was asked for; use the element \
                     type of its dtype",
                    self.id.index,
                    self.spec.dtype.name(),
                    T::DTYPE.name()
                ),
            ));
        }
        Ok(Allocation::new(self))
    }
}

/// A byte range of one allocation, as every data-plane operation addresses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// The allocation.
    pub id: AllocationId,
    /// Offset of the range from the start of every PE's heap.
    pub heap_offset: u64,
    /// Length in bytes.
    pub bytes: u64,
}

/// Something usable as a symmetric target of `T` elements: an [`Allocation`] or a [`View`].
pub trait Symmetric<T: Element> {
    /// The byte range it covers.
    fn region(&self) -> Region;

    /// Number of elements.
    fn len(&self) -> usize {
        (self.region().bytes as usize) / std::mem::size_of::<T>()
    }

    /// True if it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An owned symmetric allocation of `len` elements of `T` (the same offset on every PE).
#[derive(Debug)]
pub struct Allocation<T: Element> {
    record: AllocationRecord,
    _element: PhantomData<T>,
}

impl<T: Element> Allocation<T> {
    pub(crate) fn new(record: AllocationRecord) -> Self {
        Allocation {
            record,
            _element: PhantomData,
        }
    }

    pub(crate) fn into_record(self) -> AllocationRecord {
        self.record
    }

    /// Its id.
    pub fn id(&self) -> AllocationId {
        self.record.id
    }

    /// What the runtime records about it.
    pub fn record(&self) -> &AllocationRecord {
        &self.record
    }

    /// Elements `range` of it, as a view (fails if the range is past the end).
    pub fn view(&self, range: impl RangeBounds<usize>) -> Result<View<'_, T>> {
        self.as_view().view(range)
    }

    /// The whole allocation as a view.
    pub fn as_view(&self) -> View<'_, T> {
        View {
            region: Symmetric::region(self),
            _allocation: PhantomData,
        }
    }
}

impl<T: Element> Symmetric<T> for Allocation<T> {
    fn region(&self) -> Region {
        Region {
            id: self.record.id,
            heap_offset: self.record.offset,
            bytes: self.record.bytes,
        }
    }
}

/// A sub-range of an allocation; borrows it, so the allocation cannot be freed meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct View<'a, T: Element> {
    region: Region,
    _allocation: PhantomData<&'a Allocation<T>>,
}

impl<T: Element> View<'_, T> {
    /// Elements `range` of this view, as a narrower view (fails if the range is past the end).
    pub fn view(&self, range: impl RangeBounds<usize>) -> Result<Self> {
        let len = Symmetric::len(self);
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => len,
        };
        if start > end || end > len {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "view",
                format!("elements {start}..{end} are past the end of a range of {len} elements"),
            ));
        }
        let size = std::mem::size_of::<T>() as u64;
        Ok(View {
            region: Region {
                id: self.region.id,
                heap_offset: self.region.heap_offset + start as u64 * size,
                bytes: (end - start) as u64 * size,
            },
            _allocation: PhantomData,
        })
    }
}

impl<T: Element> Symmetric<T> for View<'_, T> {
    fn region(&self) -> Region {
        self.region
    }
}
