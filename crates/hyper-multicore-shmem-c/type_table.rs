// The ONE list of the OpenSHMEM 1.5 standard types (read by build.rs only). build.rs turns it
// into the C header's X-macro lists (`hmshmem_types.h`) and the Rust entry points of every typed
// call (`typed_calls.rs` in OUT_DIR), so a type is added or removed here and nowhere else.

/// Part of the RMA family (every standard RMA type).
const RMA: u32 = 1;
/// Atomic fetch, set and swap (the extended AMO types).
const AMO_EXTENDED: u32 = 1 << 1;
/// Every other non-bitwise atomic (the standard AMO types).
const AMO_STANDARD: u32 = 1 << 2;
/// Atomic and, or, xor (the bitwise AMO types).
const AMO_BITWISE: u32 = 1 << 3;
/// Point-to-point synchronisation (wait_until, test and their forms).
const SYNC: u32 = 1 << 4;
/// Passed by value through the C ABI from Rust (`long double` is not: its `p`/`g` are inline
/// functions of `shmem.h` over `putmem`/`getmem`).
const VALUE: u32 = 1 << 6;
/// In the C11 `_Generic` lists of the bitwise families only (atomics and reductions): the signed
/// fixed-width types, whose C types (`signed char`, `short`, `int`, `long`) are in no bitwise
/// family themselves.
const GENERIC_BITWISE: u32 = 1 << 8;
/// Team reductions `shmem_TYPENAME_{and,or,xor}_reduce`.
const REDUCE_BITWISE: u32 = 1 << 7;
/// Team reductions `shmem_TYPENAME_{min,max}_reduce`.
const REDUCE_MINMAX: u32 = 1 << 9;
/// Team reductions `shmem_TYPENAME_{sum,prod}_reduce`.
const REDUCE_ARITH: u32 = 1 << 10;
/// Legacy active-set reductions `shmem_TYPENAME_{and,or,xor}_to_all`.
const TO_ALL_BITWISE: u32 = 1 << 11;
/// Legacy active-set reductions `shmem_TYPENAME_{min,max}_to_all`.
const TO_ALL_MINMAX: u32 = 1 << 12;
/// Legacy active-set reductions `shmem_TYPENAME_{sum,prod}_to_all`.
const TO_ALL_ARITH: u32 = 1 << 13;
/// Reduced by the C layer's own combine in C (`collectives::reduce_long_double`), not by the
/// runtime (which has no arithmetic for the type).
const COMBINED_IN_C: u32 = 1 << 14;
/// In the C11 `_Generic` lists (the fixed-width and size typedefs alias other types, so the
/// standard leaves them out).
const GENERIC: u32 = 1 << 5;

/// One standard type.
struct StandardType {
    /// The C type.
    c: &'static str,
    /// Its TYPENAME in the function names.
    name: &'static str,
    /// The Rust type of the same size and representation.
    rust: &'static str,
    /// The families (bits above) it belongs to.
    families: u32,
}

const fn t(c: &'static str, name: &'static str, rust: &'static str, families: u32) -> StandardType {
    StandardType { c, name, rust, families }
}

/// Min, max, sum and prod (the standard's reductions of signed and floating types).
const NUMERIC: u32 = REDUCE_MINMAX | REDUCE_ARITH;
/// Every reduction (the standard's unsigned and fixed-width types).
const ALL_REDUCE: u32 = REDUCE_BITWISE | NUMERIC;
/// The legacy reductions of `short`, `int`, `long` and `long long`: every operator.
const TO_ALL: u32 = TO_ALL_BITWISE | TO_ALL_MINMAX | TO_ALL_ARITH;
const EXT: u32 = RMA | VALUE | AMO_EXTENDED | NUMERIC | TO_ALL_MINMAX | TO_ALL_ARITH;
const STD: u32 = RMA | VALUE | AMO_EXTENDED | AMO_STANDARD | SYNC;
const BIT: u32 = STD | AMO_BITWISE | ALL_REDUCE;
/// A small integer type (RMA only) with every reduction.
const SMALL: u32 = RMA | VALUE | ALL_REDUCE;

/// The standard types, in the specification's order.
const STANDARD_TYPES: &[StandardType] = &[
    t("float", "float", "f32", EXT | GENERIC),
    t("double", "double", "f64", EXT | GENERIC),
    // Its reductions move raw bytes and combine in C: Rust has no x87 80-bit arithmetic.
    t(
        "long double",
        "longdouble",
        "[u8; 16]",
        RMA | NUMERIC | TO_ALL_MINMAX | TO_ALL_ARITH | COMBINED_IN_C | GENERIC,
    ),
    t("char", "char", "std::ffi::c_char", RMA | VALUE | NUMERIC | GENERIC),
    t("signed char", "schar", "i8", RMA | VALUE | NUMERIC | GENERIC),
    t("short", "short", "i16", RMA | VALUE | SYNC | NUMERIC | TO_ALL | GENERIC),
    t("int", "int", "i32", STD | NUMERIC | TO_ALL | GENERIC),
    t("long", "long", "i64", STD | NUMERIC | TO_ALL | GENERIC),
    t("long long", "longlong", "i64", STD | NUMERIC | TO_ALL | GENERIC),
    t("unsigned char", "uchar", "u8", SMALL | GENERIC),
    t("unsigned short", "ushort", "u16", SMALL | SYNC | GENERIC),
    t("unsigned int", "uint", "u32", BIT | GENERIC),
    t("unsigned long", "ulong", "u64", BIT | GENERIC),
    t("unsigned long long", "ulonglong", "u64", BIT | GENERIC),
    t("int8_t", "int8", "i8", SMALL | GENERIC_BITWISE),
    t("int16_t", "int16", "i16", SMALL | GENERIC_BITWISE),
    t("int32_t", "int32", "i32", BIT | GENERIC_BITWISE),
    t("int64_t", "int64", "i64", BIT | GENERIC_BITWISE),
    t("uint8_t", "uint8", "u8", SMALL),
    t("uint16_t", "uint16", "u16", SMALL),
    t("uint32_t", "uint32", "u32", BIT),
    t("uint64_t", "uint64", "u64", BIT),
    t("size_t", "size", "u64", STD | ALL_REDUCE),
    t("ptrdiff_t", "ptrdiff", "i64", STD | NUMERIC),
    // Reduction types only: sum and prod.
    t("float _Complex", "complexf", "[f32; 2]", REDUCE_ARITH | TO_ALL_ARITH | GENERIC),
    t("double _Complex", "complexd", "[f64; 2]", REDUCE_ARITH | TO_ALL_ARITH | GENERIC),
];

/// The sized RMA forms (`shmem_put32`, …): bits, and the bytes of one element.
const SIZED: &[(u32, usize)] = &[(8, 1), (16, 2), (32, 4), (64, 8), (128, 16)];
