//! Generates the ucp bindings with bindgen from the system's UCX headers, as a table of
//! functions that `src/lib.rs` loads from `libucp.so.0` at run time (nothing is linked).

use std::path::PathBuf;

const HINT: &str = "install the system packages with `scripts/install_system_packages.sh` \
(Debian/Ubuntu: `apt-get install -y libucx-dev libclang-dev`), or build hyper-multicore \
without the UCX transport: `cargo build --no-default-features`";

/// The functions `hyper_multicore::sys::ucx` calls: the table loads exactly these, so a
/// library missing one fails to load as a whole, with its name, before anything is called.
const USED_FUNCTIONS: &[&str] = &[
    "ucs_status_string",
    "ucp_get_version",
    "ucp_get_version_string",
    "ucp_config_read",
    "ucp_config_modify",
    "ucp_config_release",
    "ucp_init_version",
    "ucp_cleanup",
    "ucp_worker_create",
    "ucp_worker_destroy",
    "ucp_worker_query",
    "ucp_worker_get_address",
    "ucp_worker_release_address",
    "ucp_worker_progress",
    "ucp_worker_get_efd",
    "ucp_worker_arm",
    "ucp_worker_fence",
    "ucp_worker_flush_nbx",
    "ucp_worker_set_am_recv_handler",
    "ucp_ep_create",
    "ucp_ep_close_nbx",
    "ucp_ep_flush_nbx",
    "ucp_ep_rkey_unpack",
    "ucp_rkey_pack",
    "ucp_rkey_buffer_release",
    "ucp_rkey_destroy",
    "ucp_mem_map",
    "ucp_mem_unmap",
    "ucp_mem_query",
    "ucp_put_nbx",
    "ucp_get_nbx",
    "ucp_atomic_op_nbx",
    "ucp_am_send_nbx",
    "ucp_request_check_status",
    "ucp_request_free",
    "ucp_ep_print_info",
    // The C library's, found through libucp's own dependencies: a `FILE` for ucp_ep_print_info.
    "fdopen",
    "fclose",
];

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    // pkg-config gives the include path (its link flags are not used: the library is loaded
    // at run time, so a program that never takes the UCX route does not even load UCX); fall
    // back to the standard location when the .pc file is missing but the headers are there.
    let include_paths = match pkg_config::Config::new()
        .atleast_version("1.10")
        .cargo_metadata(false)
        .probe("ucx")
    {
        Ok(library) => library.include_paths,
        Err(error) => {
            if !std::path::Path::new("/usr/include/ucp/api/ucp.h").exists() {
                panic!("UCX (libucp >= 1.10) was not found ({error}); {HINT}");
            }
            Vec::new()
        }
    };

    let builder = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(include_paths.iter().map(|p| format!("-I{}", p.display())))
        .allowlist_function(USED_FUNCTIONS.join("|"))
        .allowlist_type("ucp_.*")
        .allowlist_type("ucs_status_t")
        .allowlist_type("ucs_status_ptr_t")
        .allowlist_type("ucs_thread_mode_t")
        .allowlist_type("ucs_memory_type_t")
        .allowlist_var("UCP_.*")
        // Enums become plain integer constants: a value UCX adds later is never UB in Rust.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        // Functions as a table loaded with `dlopen` (`Ucp::new`), every one required.
        .dynamic_library_name("Ucp")
        .dynamic_link_require_all(true)
        .layout_tests(true)
        .generate_comments(false);
    let bindings = builder
        .generate()
        .unwrap_or_else(|error| panic!("bindgen over <ucp/api/ucp.h> failed ({error}); {HINT}"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("ucp_bindings.rs"))
        .expect("write the generated bindings");
}
