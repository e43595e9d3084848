//! Generates, from the one type table (`type_table.rs`):
//! - `$OUT_DIR/typed_calls.rs`: the Rust entry point of every typed and sized call
//!   (`shmem_int_put`, `shmem_put32`, `shmem_long_atomic_fetch_add`, …), each a thin shim over
//!   the family's generic code;
//! - `<target>/<profile>/include/hmshmem_types.h`: the same lists as C X-macros, from which
//!   `shmem.h` declares the calls and builds its `_Generic` interfaces;
//!
//! and places the headers and the pkg-config file next to the libraries under `target/`:
//! `<target>/<profile>/include/{shmem.h,shmemx.h}` and `<target>/<profile>/pkgconfig/hmshmem.pc`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

include!("type_table.rs");

/// One generated entry point.
struct Call<'a> {
    name: String,
    doc: &'a str,
    params: String,
    returns: &'a str,
    body: String,
}

fn emit(out: &mut String, call: Call<'_>) {
    let Call {
        name,
        doc,
        params,
        returns,
        body,
    } = call;
    let returns = if returns.is_empty() {
        String::new()
    } else {
        format!(" -> {returns}")
    };
    writeln!(
        out,
        "/// `{name}`: {doc}\n///\n/// # Safety\n/// Pointers as `shmem.h` requires (symmetric \
         addresses where it says so, local buffers valid for the elements named).\n#[no_mangle]\n\
         pub unsafe extern \"C\" fn {name}({params}){returns} {{\n    const CALL: &str = \
         \"{name}\";\n{body}}}\n"
    )
    .unwrap();
}

/// Emits `call` and its context form `shmem_ctx_…(ctx, …)`: every context is the default one,
/// so the twin checks the handle and does the same.
fn emit_with_context(out: &mut String, call: Call<'_>) {
    let twin = Call {
        name: call.name.replacen("shmem_", "shmem_ctx_", 1),
        doc: call.doc,
        params: format!("ctx: usize, {}", call.params),
        returns: call.returns,
        body: format!("    contexts::check(CALL, ctx);\n{}", call.body),
    };
    emit(out, call);
    emit(out, twin);
}

/// A caller buffer of `len` (an expression) bytes at `pointer`, bound to `var`.
/// The source of a collective (`sys/collective_source.rs`): the symmetric range it is, or its
/// bytes.
fn collective_source(len: &str) -> String {
    format!(
        "    // SAFETY: the caller passes `source` valid for these bytes (function contract).\n    \
         let source = unsafe {{ CollectiveSource::new(source.cast::<u8>(), {len}) }};\n"
    )
}

fn buffer(var: &str, pointer: &str, len: &str) -> String {
    format!(
        "    // SAFETY: the caller passes `{pointer}` valid for these bytes (function contract).\n    \
         let {var} = unsafe {{ CallerBuffer::new({pointer}.cast::<u8>(), {len}) }};\n"
    )
}

/// The RMA calls of one element type: `name(op, suffix)` names them, `ty` is the pointee type
/// of their pointers, `size` the element size expression; `typed` adds `p`/`g`, `strided` the
/// `iput`/`iget` forms.
fn rma_calls(
    out: &mut String,
    name: &dyn Fn(&str, &str) -> String,
    ty: &str,
    size: &str,
    typed: bool,
    strided: bool,
) {
    let bytes = format!("rma::bytes(CALL, nelems, {size})");
    for (suffix, nbi) in [("", "false"), ("_nbi", "true")] {
        emit_with_context(
            out,
            Call {
                name: name("put", suffix),
                doc: "copies `nelems` elements of `source` into PE `pe`'s copy of `dest`.",
                params: format!("dest: *mut {ty}, source: *const {ty}, nelems: usize, pe: c_int"),
                returns: "",
                body: buffer("source", "source", &bytes)
                    + &format!("    rma::put(CALL, dest as usize, source, pe, {nbi});\n"),
            },
        );
        emit_with_context(
            out,
            Call {
                name: name("get", suffix),
                doc: "copies `nelems` elements of PE `pe`'s copy of `source` into `dest`.",
                params: format!("dest: *mut {ty}, source: *const {ty}, nelems: usize, pe: c_int"),
                returns: "",
                body: buffer("dest", "dest", &bytes)
                    + &format!("    rma::get(CALL, dest, source as usize, pe, {nbi});\n"),
            },
        );
        emit_with_context(out, Call {
            name: name("put", &format!("_signal{suffix}")),
            doc: "puts, then sets or adds `signal` to PE `pe`'s signal word `sig_addr`.",
            params: format!(
                "dest: *mut {ty}, source: *const {ty}, nelems: usize, sig_addr: *mut u64, \
                 signal: u64, sig_op: c_int, pe: c_int"
            ),
            returns: "",
            body: buffer("source", "source", &bytes)
                + "    rma::put_signal(CALL, dest as usize, source, sig_addr as usize, signal, sig_op, pe);\n",
        });
    }
    if strided {
        let span = |stride: &str| format!("rma::strided_bytes(CALL, nelems, {stride}, {size})");
        emit_with_context(out, Call {
            name: name("iput", ""),
            doc: "strided put: `nelems` elements, `sst` apart in `source`, `dst` apart in `dest`.",
            params: format!(
                "dest: *mut {ty}, source: *const {ty}, dst: isize, sst: isize, nelems: usize, pe: c_int"
            ),
            returns: "",
            body: buffer("source", "source", &span("sst"))
                + &format!("    rma::iput(CALL, dest as usize, source, [dst, sst], {size}, nelems, pe);\n"),
        });
        emit_with_context(out, Call {
            name: name("iget", ""),
            doc: "strided get: `nelems` elements, `sst` apart in `source`, `dst` apart in `dest`.",
            params: format!(
                "dest: *mut {ty}, source: *const {ty}, dst: isize, sst: isize, nelems: usize, pe: c_int"
            ),
            returns: "",
            body: buffer("dest", "dest", &span("dst"))
                + &format!("    rma::iget(CALL, dest, source as usize, [dst, sst], {size}, nelems, pe);\n"),
        });
    }
    if typed {
        emit_with_context(
            out,
            Call {
                name: name("p", ""),
                doc: "stores `value` into PE `pe`'s copy of `dest`.",
                params: format!("dest: *mut {ty}, value: {ty}, pe: c_int"),
                returns: "",
                body: "    rma::p(CALL, dest as usize, value, pe);\n".into(),
            },
        );
        emit_with_context(
            out,
            Call {
                name: name("g", ""),
                doc: "PE `pe`'s copy of `source`.",
                params: format!("source: *const {ty}, pe: c_int"),
                returns: ty,
                body: "    rma::g(CALL, source as usize, pe)\n".into(),
            },
        );
    }
}

/// A fetching atomic `op` and its `_nbi` form: `params` come between `dest` and `pe`, `value`
/// is the `atomics::` call computing the old value.
fn fetching(out: &mut String, n: &str, r: &str, op: &str, doc: &str, params: &str, value: &str) {
    let name = |op: &str| format!("shmem_{n}_atomic_{op}");
    emit_with_context(
        out,
        Call {
            name: name(op),
            doc,
            params: format!("dest: *mut {r}, {params}pe: c_int"),
            returns: r,
            body: format!("    atomics::{value}\n"),
        },
    );
    emit_with_context(
        out,
        Call {
            name: name(&format!("{op}_nbi")),
            doc: "the non-blocking form: the old value lands in `fetch`.",
            params: format!("fetch: *mut {r}, dest: *mut {r}, {params}pe: c_int"),
            returns: "",
            body: buffer("fetch", "fetch", &format!("std::mem::size_of::<{r}>()"))
                + &format!("    atomics::deliver::<{r}>(fetch, atomics::{value});\n"),
        },
    );
}

/// A non-fetching atomic `op` (the result of `value` is dropped).
fn plain(out: &mut String, n: &str, r: &str, op: &str, doc: &str, params: &str, value: &str) {
    emit_with_context(
        out,
        Call {
            name: format!("shmem_{n}_atomic_{op}"),
            doc,
            params: format!("dest: *mut {r}, {params}pe: c_int"),
            returns: "",
            body: format!("    atomics::{value};\n"),
        },
    );
}

/// The atomics of one type.
fn amo_calls(out: &mut String, t: &StandardType) {
    let (n, r) = (t.name, t.rust);
    let value = format!("value: {r}, ");
    if t.families & AMO_EXTENDED != 0 {
        let doc = "replaces PE `pe`'s `dest` by `value`, returns the old value.";
        fetching(
            out,
            n,
            r,
            "swap",
            doc,
            &value,
            "swap(CALL, dest as usize, value, pe)",
        );
        let doc = "stores `value` into PE `pe`'s `dest` atomically.";
        plain(
            out,
            n,
            r,
            "set",
            doc,
            &value,
            &format!("set::<{r}>(CALL, dest as usize, value, pe)"),
        );
        emit_with_context(
            out,
            Call {
                name: format!("shmem_{n}_atomic_fetch"),
                doc: "PE `pe`'s `source`, read atomically.",
                params: format!("source: *const {r}, pe: c_int"),
                returns: r,
                body: "    atomics::fetch(CALL, source as usize, pe)\n".into(),
            },
        );
        emit_with_context(out, Call {
            name: format!("shmem_{n}_atomic_fetch_nbi"),
            doc: "the non-blocking form: the value lands in `fetch`.",
            params: format!("fetch: *mut {r}, source: *const {r}, pe: c_int"),
            returns: "",
            body: buffer("fetch", "fetch", &format!("std::mem::size_of::<{r}>()"))
                + &format!("    atomics::deliver::<{r}>(fetch, atomics::fetch(CALL, source as usize, pe));\n"),
        });
    }
    if t.families & AMO_STANDARD != 0 {
        let doc = "sets PE `pe`'s `dest` to `value` if it equals `cond`; returns the old value.";
        let cond = format!("cond: {r}, value: {r}, ");
        fetching(
            out,
            n,
            r,
            "compare_swap",
            doc,
            &cond,
            "compare_swap(CALL, dest as usize, cond, value, pe)",
        );
        let doc = "adds one to PE `pe`'s `dest`, returns the old value.";
        fetching(
            out,
            n,
            r,
            "fetch_inc",
            doc,
            "",
            &format!("fetch_inc::<{r}>(CALL, dest as usize, pe)"),
        );
        let doc = "adds `value` to PE `pe`'s `dest`, returns the old value.";
        fetching(
            out,
            n,
            r,
            "fetch_add",
            doc,
            &value,
            "fetch_add(CALL, dest as usize, value, pe)",
        );
        let doc = "adds one to PE `pe`'s `dest`.";
        plain(
            out,
            n,
            r,
            "inc",
            doc,
            "",
            &format!("inc::<{r}>(CALL, dest as usize, pe)"),
        );
        let doc = "adds `value` to PE `pe`'s `dest`.";
        plain(
            out,
            n,
            r,
            "add",
            doc,
            &value,
            "add(CALL, dest as usize, value, pe)",
        );
    }
    if t.families & AMO_BITWISE != 0 {
        for (op, variant) in [("and", "And"), ("or", "Or"), ("xor", "Xor")] {
            let call = format!(
                "fetch_bitwise(CALL, dest as usize, value, atomics::Bitwise::{variant}, pe)"
            );
            let doc = "applies the bitwise operation to PE `pe`'s `dest`, returns the old value.";
            fetching(out, n, r, &format!("fetch_{op}"), doc, &value, &call);
            let doc = "applies the bitwise operation to PE `pe`'s `dest`.";
            plain(out, n, r, op, doc, &value, &call);
        }
    }
}

/// The deprecated atomic names of one type (`shmem_long_fadd`, `shmem_int_cswap`, …), which
/// older benchmarks still use: the same calls as their `atomic_` successors.
fn deprecated_amo_calls(out: &mut String, t: &StandardType) {
    let (n, r) = (t.name, t.rust);
    let mut calls: Vec<(&str, String, &str, String)> = Vec::new();
    if t.families & AMO_EXTENDED != 0 {
        calls.push((
            "fetch",
            format!("source: *const {r}, pe: c_int"),
            r,
            "fetch(CALL, source as usize, pe)".to_string(),
        ));
        calls.push((
            "set",
            format!("dest: *mut {r}, value: {r}, pe: c_int"),
            "",
            "set(CALL, dest as usize, value, pe)".to_string(),
        ));
        calls.push((
            "swap",
            format!("dest: *mut {r}, value: {r}, pe: c_int"),
            r,
            "swap(CALL, dest as usize, value, pe)".to_string(),
        ));
    }
    if t.families & AMO_STANDARD != 0 {
        calls.push((
            "cswap",
            format!("dest: *mut {r}, cond: {r}, value: {r}, pe: c_int"),
            r,
            "compare_swap(CALL, dest as usize, cond, value, pe)".to_string(),
        ));
        calls.push((
            "fadd",
            format!("dest: *mut {r}, value: {r}, pe: c_int"),
            r,
            "fetch_add(CALL, dest as usize, value, pe)".to_string(),
        ));
        let finc = format!("fetch_inc::<{r}>(CALL, dest as usize, pe)");
        calls.push(("finc", format!("dest: *mut {r}, pe: c_int"), r, finc));
        calls.push((
            "add",
            format!("dest: *mut {r}, value: {r}, pe: c_int"),
            "",
            "add(CALL, dest as usize, value, pe)".to_string(),
        ));
        let inc = format!("inc::<{r}>(CALL, dest as usize, pe)");
        calls.push(("inc", format!("dest: *mut {r}, pe: c_int"), "", inc));
    }
    for (op, params, returns, value) in calls {
        let end = if returns.is_empty() { ";" } else { "" };
        emit(
            out,
            Call {
                name: format!("shmem_{n}_{op}"),
                doc: "deprecated name of the `atomic_` call of the same operation.",
                params,
                returns,
                body: format!("    atomics::{value}{end}\n"),
            },
        );
    }
}

/// wait_until, test and their forms for one type.
fn sync_calls(out: &mut String, t: &StandardType) {
    let (n, r) = (t.name, t.rust);
    let name = |op: &str| format!("shmem_{n}_{op}");
    emit(
        out,
        Call {
            name: name("wait_until"),
            doc: "waits until this PE's `ivar` compares `cmp` to `value`.",
            params: format!("ivar: *mut {r}, cmp: c_int, value: {r}"),
            returns: "",
            body: "    wait::wait_until(CALL, ivar as usize, cmp, value);\n".into(),
        },
    );
    emit(
        out,
        Call {
            name: name("wait"),
            doc: "legacy: waits until this PE's `ivar` differs from `value`.",
            params: format!("ivar: *mut {r}, value: {r}"),
            returns: "",
            body: "    wait::wait_until(CALL, ivar as usize, 1, value);\n".into(),
        },
    );
    emit(
        out,
        Call {
            name: name("test"),
            doc: "1 if this PE's `ivar` compares `cmp` to `value` now, else 0.",
            params: format!("ivar: *mut {r}, cmp: c_int, value: {r}"),
            returns: "c_int",
            body: "    wait::test(CALL, ivar as usize, cmp, value)\n".into(),
        },
    );
    for (op, block) in [("wait_until", true), ("test", false)] {
        for vector in [false, true] {
            let suffix = if vector { "_vector" } else { "" };
            let (value_param, targets) = if vector {
                (
                    format!("values: *const {r}"),
                    // SAFETY comment emitted with it.
                    "    // SAFETY: `values` holds `nelems` elements (function contract).\n    \
                     let targets = unsafe { read_array(values, nelems) };\n"
                        .to_string(),
                )
            } else {
                (
                    format!("value: {r}"),
                    "    let targets = vec![value; nelems];\n".to_string(),
                )
            };
            let words = targets
                + "    // SAFETY: `status` is null or holds `nelems` ints (function contract).\n    \
                   let status = unsafe { read_array(status, if status.is_null() { 0 } else { nelems }) };\n    \
                   let words = wait::Words { ivars: ivars as usize, nelems, status, cmp, targets };\n";
            let all_returns = if block { "" } else { "c_int" };
            let all_tail = if block {
                "    wait::wait_words(CALL, &words, wait::Quantifier::All, true);\n".to_string()
            } else {
                "    let active = words.status.iter().filter(|&&s| s == 0).count();\n    \
                 let met = wait::wait_words(CALL, &words, wait::Quantifier::All, false).len();\n    \
                 c_int::from(met > 0 || (active == 0 && !words.status.is_empty()) || nelems == 0)\n"
                    .to_string()
            };
            emit(out, Call {
                name: name(&format!("{op}_all{suffix}")),
                doc: "every word not masked by `status` compares `cmp` to its value.",
                params: format!("ivars: *mut {r}, nelems: usize, status: *const c_int, cmp: c_int, {value_param}"),
                returns: all_returns,
                body: words.clone() + &all_tail,
            });
            emit(out, Call {
                name: name(&format!("{op}_any{suffix}")),
                doc: "the index of a word that compares `cmp` to its value (SIZE_MAX: none).",
                params: format!("ivars: *mut {r}, nelems: usize, status: *const c_int, cmp: c_int, {value_param}"),
                returns: "usize",
                body: words.clone()
                    + &format!("    wait::wait_words(CALL, &words, wait::Quantifier::Any, {block}).first().copied().unwrap_or(usize::MAX)\n"),
            });
            emit(out, Call {
                name: name(&format!("{op}_some{suffix}")),
                doc: "how many words compare `cmp` to their value; their indices land in `indices`.",
                params: format!("ivars: *mut {r}, nelems: usize, indices: *mut usize, status: *const c_int, cmp: c_int, {value_param}"),
                returns: "usize",
                body: words
                    + &format!("    let met = wait::wait_words(CALL, &words, wait::Quantifier::Some, {block});\n    \
                       // SAFETY: `indices` holds `nelems` elements, at least `met.len()` (function contract).\n    \
                       unsafe {{ write_array(indices, &met) }};\n    met.len()\n"),
            });
        }
    }
}

/// The typed team collectives of one type: broadcast, fcollect, alltoall (RMA types), and the
/// reductions the standard lists for it with their legacy active-set forms.
fn collective_calls(out: &mut String, t: &StandardType) {
    let (n, r) = (t.name, t.rust);
    if t.families & RMA != 0 {
        let size = format!("std::mem::size_of::<{r}>()");
        team_moves(out, &|op| format!("shmem_{n}_{op}"), r, &size);
    }
    reductions(out, t);
}

/// The first line of every team collective: a handle that names no team (`SHMEM_TEAM_INVALID`,
/// destroyed, finalized) returns nonzero at once, doing nothing (the standard leaves it
/// undefined; every PE passing it does the same, so nobody waits).
const TEAM_OR_NONZERO: &str =
    "    let Some(team) = teams::lookup(CALL, team) else { return -1 };\n";

/// The data-moving team collectives (broadcast, fcollect, collect, alltoall, alltoalls) of one
/// element type: `name(op)` names them, `r` is their pointee type, `size` the element size.
fn team_moves(out: &mut String, name: &dyn Fn(&str) -> String, r: &str, size: &str) {
    // (operation, documentation, extra parameter, elements in `source`, extra argument)
    let moves = [
        (
            "broadcast",
            "collective: `nelems` elements of `source` on PE `root` into every PE's `dest`.",
            ", root: c_int",
            "nelems",
            ", root",
        ),
        (
            "fcollect",
            "collective: every PE's `nelems` elements of `source` into every PE's `dest`.",
            "",
            "nelems",
            "",
        ),
        (
            "collect",
            "collective: every PE's `nelems` elements (its own count) of `source` into every PE's `dest`, in PE order.",
            "",
            "nelems",
            "",
        ),
        (
            "alltoall",
            "collective: block `j` (`nelems` elements) of `source` to PE `j`'s block `my_pe`.",
            "",
            "nelems * team.size(CALL)",
            "",
        ),
    ];
    for (op, doc, extra, elements, argument) in moves {
        emit(
            out,
            Call {
                name: name(op),
                doc,
                params: format!(
                    "team: usize, dest: *mut {r}, source: *const {r}, nelems: usize{extra}"
                ),
                returns: "c_int",
                body: String::from(TEAM_OR_NONZERO)
                    + &collective_source(&format!("rma::bytes(CALL, {elements}, {size})"))
                    + &format!(
                        "    collectives::{op}(CALL, &team, dest as usize, source{argument});\n    0\n"
                    ),
            },
        );
    }
    emit(
        out,
        Call {
            name: name("alltoalls"),
            doc: "collective: strided alltoall (`sst` elements apart in `source`, `dst` in `dest`).",
            params: format!(
                "team: usize, dest: *mut {r}, source: *const {r}, dst: isize, sst: isize, nelems: usize"
            ),
            returns: "c_int",
            body: String::from(TEAM_OR_NONZERO)
                + &collective_source(&format!(
                    "rma::strided_bytes(CALL, nelems * team.size(CALL), sst, {size})"
                ))
                + &format!(
                    "    collectives::alltoalls(CALL, &team, dest as usize, source, [dst, sst], {size}, nelems);\n    0\n"
                ),
        },
    );
}

/// The reduction operators: name, `ReduceOp` variant, the family of the types with its team
/// form, the family of those with its legacy active-set form.
const REDUCTIONS: [(&str, &str, u32, u32); 7] = [
    ("and", "And", REDUCE_BITWISE, TO_ALL_BITWISE),
    ("or", "Or", REDUCE_BITWISE, TO_ALL_BITWISE),
    ("xor", "Xor", REDUCE_BITWISE, TO_ALL_BITWISE),
    ("min", "Min", REDUCE_MINMAX, TO_ALL_MINMAX),
    ("max", "Max", REDUCE_MINMAX, TO_ALL_MINMAX),
    ("sum", "Sum", REDUCE_ARITH, TO_ALL_ARITH),
    ("prod", "Prod", REDUCE_ARITH, TO_ALL_ARITH),
];

/// The reductions of one type (team and legacy forms, as its families list them).
fn reductions(out: &mut String, t: &StandardType) {
    let (n, r) = (t.name, t.rust);
    let reduce = if t.families & COMBINED_IN_C != 0 {
        String::from("reduce_long_double")
    } else {
        format!("reduce::<{r}>")
    };
    for (op, variant, team_family, legacy_family) in REDUCTIONS {
        if t.families & team_family != 0 {
            emit(out, Call {
                name: format!("shmem_{n}_{op}_reduce"),
                doc: "collective: every team PE's `nreduce` elements of `source`, combined element-wise, into every team PE's `dest`.",
                params: format!("team: usize, dest: *mut {r}, source: *const {r}, nreduce: usize"),
                returns: "c_int",
                body: format!(
                    "{TEAM_OR_NONZERO}    collectives::{reduce}(CALL, &team, dest as usize, source as usize, nreduce, ReduceOp::{variant});\n    0\n"
                ),
            });
        }
        if t.families & legacy_family != 0 {
            emit(out, Call {
                name: format!("shmem_{n}_{op}_to_all"),
                doc: "legacy reduction over an active set; `pWrk` and `pSync` are not needed.",
                params: format!(
                    "dest: *mut {r}, source: *const {r}, nreduce: c_int, start: c_int, log_stride: c_int, \
                     size: c_int, _p_wrk: *mut {r}, _p_sync: *mut std::ffi::c_long"
                ),
                returns: "",
                body: format!(
                    "    let active = collectives::active_set(CALL, start, log_stride, size);\n    \
                     let nreduce = usize::try_from(nreduce).unwrap_or_else(|_| crate::failure::fail(CALL, \"nreduce must not be negative\"));\n    \
                     collectives::{reduce}(CALL, &active, dest as usize, source as usize, nreduce, ReduceOp::{variant});\n"
                ),
            });
        }
    }
}

/// The legacy sized active-set collectives (`shmem_broadcast32`, `shmem_fcollect64`, …).
fn legacy_sized_calls(out: &mut String, bits: u32, bytes: usize) {
    let params = "start: c_int, log_stride: c_int, size: c_int, _p_sync: *mut std::ffi::c_long";
    let active = "    let active = collectives::active_set(CALL, start, log_stride, size);\n";
    // (name, documentation, extra parameter, elements in `source`, the collectives:: call)
    let calls = [
        ("broadcast", "legacy broadcast over an active set (`root` counts in it): the root's `dest` is not written.", " root: c_int,", "nelems", "broadcast_keeping_root(CALL, &active, dest as usize, source, root)"),
        ("fcollect", "legacy fcollect over an active set.", "", "nelems", "fcollect(CALL, &active, dest as usize, source)"),
        ("collect", "legacy collect over an active set.", "", "nelems", "collect(CALL, &active, dest as usize, source)"),
        ("alltoall", "legacy alltoall over an active set.", "", "nelems * active.size(CALL)", "alltoall(CALL, &active, dest as usize, source)"),
    ];
    emit(
        out,
        Call {
            name: format!("shmem_alltoalls{bits}"),
            doc: "legacy strided alltoall over an active set.",
            params: format!(
                "dest: *mut c_void, source: *const c_void, dst: isize, sst: isize, nelems: usize, {params}"
            ),
            returns: "",
            body: String::from(active)
                + &collective_source(&format!(
                    "rma::strided_bytes(CALL, nelems * active.size(CALL), sst, {bytes})"
                ))
                + &format!(
                    "    collectives::alltoalls(CALL, &active, dest as usize, source, [dst, sst], {bytes}, nelems);\n"
                ),
        },
    );
    for (op, doc, extra, elements, call) in calls {
        emit(
            out,
            Call {
                name: format!("shmem_{op}{bits}"),
                doc,
                params: format!(
                    "dest: *mut c_void, source: *const c_void, nelems: usize,{extra} {params}"
                ),
                returns: "",
                body: String::from(active)
                    + &collective_source(&format!("rma::bytes(CALL, {elements}, {bytes})"))
                    + &format!("    collectives::{call};\n"),
            },
        );
    }
}

fn rust_calls() -> String {
    let mut out = String::new();
    for t in STANDARD_TYPES {
        let typed = |op: &str, suffix: &str| format!("shmem_{}_{op}{suffix}", t.name);
        let size = format!("std::mem::size_of::<{}>()", t.rust);
        if t.families & RMA != 0 {
            rma_calls(
                &mut out,
                &typed,
                t.rust,
                &size,
                t.families & VALUE != 0,
                true,
            );
        }
        amo_calls(&mut out, t);
        if t.families & SYNC != 0 {
            sync_calls(&mut out, t);
        }
        collective_calls(&mut out, t);
        deprecated_amo_calls(&mut out, t);
    }
    for &(bits, bytes) in SIZED {
        let sized = move |op: &str, suffix: &str| format!("shmem_{op}{bits}{suffix}");
        rma_calls(&mut out, &sized, "c_void", &bytes.to_string(), false, true);
    }
    for &(bits, bytes) in SIZED.iter().filter(|&&(bits, _)| bits == 32 || bits == 64) {
        legacy_sized_calls(&mut out, bits, bytes);
    }
    team_moves(&mut out, &|op| format!("shmem_{op}mem"), "c_void", "1");
    let mem = |op: &str, suffix: &str| format!("shmem_{op}mem{suffix}");
    rma_calls(&mut out, &mem, "c_void", "1", false, false);
    out
}

/// `#define NAME(X, A) X(c type, TYPENAME, A) …` for the types in `family` (`A` is passed
/// through: the operation of a `_Generic` case, unused by declarations).
fn x_macro(out: &mut String, macro_name: &str, family: u32) {
    write!(out, "#define {macro_name}(X, A)").unwrap();
    for t in STANDARD_TYPES
        .iter()
        .filter(|t| t.families & family == family)
    {
        write!(out, " \\\n  X({}, {}, A)", t.c, t.name).unwrap();
    }
    out.push_str("\n\n");
}

/// `#define NAME(OP) c type: PREFIXTYPENAME_##OP, …` for the generic types in `family`
/// (`PREFIX` is `shmem_`, or `shmem_ctx_` for the forms taking a context first): the
/// associations of `shmem.h`'s `_Generic` selections (a list of its own, so a program may use
/// the generic calls inside its own expansion of the X-macro lists).
fn generic_cases(out: &mut String, macro_name: &str, prefix: &str, family: u32) {
    write!(out, "#define {macro_name}(OP)").unwrap();
    for t in STANDARD_TYPES
        .iter()
        .filter(|t| t.families & family == family)
        .filter(|t| {
            t.families & GENERIC != 0
                || (matches!(family, REDUCE_BITWISE | AMO_BITWISE)
                    && t.families & GENERIC_BITWISE != 0)
        })
    {
        write!(out, " \\\n  {}: {prefix}{}_##OP,", t.c, t.name).unwrap();
    }
    out.push_str("\n\n");
}

fn c_header() -> String {
    let mut out = String::from(
        "/* Generated by crates/hyper-multicore-shmem-c/build.rs from type_table.rs: the standard\n \
         * types of each family as X-macros, X(C type, TYPENAME, A). Do not edit. */\n\
         #ifndef HMSHMEM_TYPES_H\n#define HMSHMEM_TYPES_H\n\n",
    );
    x_macro(&mut out, "HMSHMEM_RMA_TYPES", RMA);
    x_macro(&mut out, "HMSHMEM_RMA_VALUE_TYPES", RMA | VALUE);
    x_macro(&mut out, "HMSHMEM_AMO_EXTENDED_TYPES", AMO_EXTENDED);
    x_macro(&mut out, "HMSHMEM_AMO_STANDARD_TYPES", AMO_STANDARD);
    x_macro(&mut out, "HMSHMEM_AMO_BITWISE_TYPES", AMO_BITWISE);
    x_macro(&mut out, "HMSHMEM_SYNC_TYPES", SYNC);
    x_macro(&mut out, "HMSHMEM_REDUCE_BITWISE_TYPES", REDUCE_BITWISE);
    x_macro(&mut out, "HMSHMEM_REDUCE_MINMAX_TYPES", REDUCE_MINMAX);
    x_macro(&mut out, "HMSHMEM_REDUCE_ARITH_TYPES", REDUCE_ARITH);
    x_macro(&mut out, "HMSHMEM_TO_ALL_BITWISE_TYPES", TO_ALL_BITWISE);
    x_macro(&mut out, "HMSHMEM_TO_ALL_MINMAX_TYPES", TO_ALL_MINMAX);
    x_macro(&mut out, "HMSHMEM_TO_ALL_ARITH_TYPES", TO_ALL_ARITH);
    x_macro(
        &mut out,
        "HMSHMEM_DEPRECATED_AMO_EXTENDED_TYPES",
        AMO_EXTENDED,
    );
    x_macro(
        &mut out,
        "HMSHMEM_DEPRECATED_AMO_STANDARD_TYPES",
        AMO_STANDARD,
    );
    x_macro(&mut out, "HMSHMEM_RMA_GENERIC_TYPES", RMA | GENERIC);
    x_macro(
        &mut out,
        "HMSHMEM_AMO_EXTENDED_GENERIC_TYPES",
        AMO_EXTENDED | GENERIC,
    );
    x_macro(
        &mut out,
        "HMSHMEM_AMO_STANDARD_GENERIC_TYPES",
        AMO_STANDARD | GENERIC,
    );
    x_macro(
        &mut out,
        "HMSHMEM_AMO_BITWISE_GENERIC_TYPES",
        AMO_BITWISE | GENERIC,
    );
    x_macro(&mut out, "HMSHMEM_SYNC_GENERIC_TYPES", SYNC | GENERIC);
    generic_cases(&mut out, "HMSHMEM_GENERIC_CASES_RMA", "shmem_", RMA);
    generic_cases(
        &mut out,
        "HMSHMEM_GENERIC_CASES_AMO_EXTENDED",
        "shmem_",
        AMO_EXTENDED,
    );
    generic_cases(
        &mut out,
        "HMSHMEM_GENERIC_CASES_AMO_STANDARD",
        "shmem_",
        AMO_STANDARD,
    );
    generic_cases(
        &mut out,
        "HMSHMEM_GENERIC_CASES_AMO_BITWISE",
        "shmem_",
        AMO_BITWISE,
    );
    generic_cases(&mut out, "HMSHMEM_GENERIC_CASES_SYNC", "shmem_", SYNC);
    generic_cases(
        &mut out,
        "HMSHMEM_GENERIC_CASES_REDUCE_BITWISE",
        "shmem_",
        REDUCE_BITWISE,
    );
    generic_cases(
        &mut out,
        "HMSHMEM_GENERIC_CASES_REDUCE_MINMAX",
        "shmem_",
        REDUCE_MINMAX,
    );
    generic_cases(
        &mut out,
        "HMSHMEM_GENERIC_CASES_REDUCE_ARITH",
        "shmem_",
        REDUCE_ARITH,
    );
    // The context-first forms exist for the RMA and atomic families.
    for (name, family) in [
        ("RMA", RMA),
        ("AMO_EXTENDED", AMO_EXTENDED),
        ("AMO_STANDARD", AMO_STANDARD),
        ("AMO_BITWISE", AMO_BITWISE),
    ] {
        let macro_name = format!("HMSHMEM_GENERIC_CASES_CTX_{name}");
        generic_cases(&mut out, &macro_name, "shmem_ctx_", family);
    }
    out.push_str("#define HMSHMEM_SIZES(X, A)");
    for &(bits, _) in SIZED {
        write!(out, " X({bits}, A)").unwrap();
    }
    out.push_str("\n\n#endif\n");
    out
}

/// The system libraries a static link of `libhmshmem.a` needs (`Libs.private` of the pkg-config
/// file): what `cargo rustc -p hyper-multicore-shmem-c --lib --crate-type staticlib --
/// --print native-static-libs` prints, less the C library itself — the unwinder of Rust's panics
/// and glibc's parts (`-ldl`: UCX, the runtime's transport between hosts, is loaded with
/// `dlopen` when a job first takes it, not linked).
const STATIC_LINK_LIBS: &str = "-lgcc_s -lutil -lrt -lpthread -lm -ldl";

fn write_if_changed(path: &Path, contents: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(contents) {
        std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

fn main() {
    println!("cargo:rerun-if-changed=type_table.rs");
    println!("cargo:rerun-if-changed=src/sys/long_double.c");
    cc::Build::new()
        .file("src/sys/long_double.c")
        .std("c11")
        .warnings(true)
        .warnings_into_errors(true)
        .compile("hmshmem_long_double");
    println!("cargo:rerun-if-changed=include");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    write_if_changed(&out_dir.join("typed_calls.rs"), &rust_calls());
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out: the libraries land in
    // <target>/<profile>, and so do the headers and the pkg-config file.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .expect("OUT_DIR lies three levels below the profile directory");
    let include = profile_dir.join("include");
    let pkgconfig = profile_dir.join("pkgconfig");
    for dir in [&include, &pkgconfig] {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    }
    write_if_changed(&include.join("hmshmem_types.h"), &c_header());
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    for header in ["shmem.h", "shmemx.h"] {
        let text = std::fs::read_to_string(manifest.join("include").join(header))
            .unwrap_or_else(|e| panic!("read include/{header}: {e}"));
        write_if_changed(&include.join(header), &text);
    }
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets it");
    let pc = format!(
        "prefix={}\nlibdir=${{prefix}}\nincludedir=${{prefix}}/include\n\n\
         Name: hmshmem\nDescription: OpenSHMEM 1.5 C API over the hyper_multicore runtime\n\
         Version: {version}\nCflags: -I${{includedir}}\n\
         Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lhmshmem\n\
         Libs.private: {STATIC_LINK_LIBS}\n",
        profile_dir.display()
    );
    write_if_changed(&pkgconfig.join("hmshmem.pc"), &pc);
}
