//! Generates the ucp bindings with bindgen from the system's UCX headers and links libucp/libucs.

use std::path::PathBuf;

const HINT: &str = "install the system packages with `scripts/install_system_packages.sh` \
(Debian/Ubuntu: `apt-get install -y libucx-dev libclang-dev`), or build hyper-multicore \
without the UCX transport: `cargo build --no-default-features`";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    // pkg-config gives the include path and `-lucp -luct -lucs -lucm`; fall back to the
    // standard location when the .pc file is missing but the headers are there.
    let include_paths = match pkg_config::Config::new()
        .atleast_version("1.10")
        .probe("ucx")
    {
        Ok(library) => library.include_paths,
        Err(error) => {
            if !std::path::Path::new("/usr/include/ucp/api/ucp.h").exists() {
                panic!("UCX (libucp >= 1.10) was not found ({error}); {HINT}");
            }
            println!("cargo:rustc-link-lib=ucp");
            println!("cargo:rustc-link-lib=ucs");
            Vec::new()
        }
    };

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(include_paths.iter().map(|p| format!("-I{}", p.display())))
        .allowlist_function("ucp_.*")
        .allowlist_function("ucs_status_string")
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
        .layout_tests(true)
        .generate_comments(false);
    // The FILE*-printing helpers drag in libc's stdio types; nothing here needs them.
    for skipped in [
        "ucp_config_print",
        "ucp_context_print_info",
        "ucp_worker_print_info",
        "ucp_ep_print_info",
        "ucp_mem_print_info",
    ] {
        builder = builder.blocklist_function(skipped);
    }
    let bindings = builder
        .generate()
        .unwrap_or_else(|error| panic!("bindgen over <ucp/api/ucp.h> failed ({error}); {HINT}"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("ucp_bindings.rs"))
        .expect("write the generated bindings");
}
