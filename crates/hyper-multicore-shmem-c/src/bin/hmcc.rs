//! `hmcc`: the C compiler wrapper of libhmshmem (what `oshcc` is to OSHMEM).
//!
//! Runs the C compiler — `$HMCC_CC`, else `$CC` unless that names `hmcc` itself (an autotools
//! build configured with `CC=hmcc` exports it), else `cc` — with the caller's arguments plus `-I<dir>/include` and, when
//! linking, `-L<dir> -Wl,-rpath,<dir> -lhmshmem`, where `<dir>` is the directory holding this
//! very executable (`target/<profile>/` after `cargo build`: the library, the headers and this
//! wrapper are built side by side).
//!
//! ```text
//! hmcc prog.c -o prog          # compile and link
//! hmcc -c prog.c               # compile only: no link flags
//! hmcc --showme prog.c -o prog # print the command instead of running it
//! ```

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Arguments that stop the compiler before linking.
const NO_LINK: &[&str] = &["-c", "-E", "-S", "-M", "-MM"];

fn main() -> ExitCode {
    let me = match std::env::current_exe() {
        Ok(me) => me,
        Err(e) => {
            eprintln!("hmcc: cannot find its own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir: PathBuf = me
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let include = dir.join("include");
    if !include.join("shmem.h").is_file() || !dir.join("libhmshmem.so").is_file() {
        eprintln!(
            "hmcc: {} has no include/shmem.h or libhmshmem.so next to hmcc; build them with \
             `cargo build -p hyper-multicore-shmem-c` (they land next to hmcc)",
            dir.display()
        );
        return ExitCode::FAILURE;
    }
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let show = args.iter().any(|a| a == "--showme");
    args.retain(|a| a != "--showme");
    let compiler = compiler(&me);
    let mut command = Command::new(&compiler);
    command.arg(format!("-I{}", include.display())).args(&args);
    if !args.iter().any(|a| NO_LINK.contains(&a.as_str())) {
        command
            .arg(format!("-L{}", dir.display()))
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lhmshmem");
    }
    if show {
        let words: Vec<String> = std::iter::once(compiler.clone())
            .chain(command.get_args().map(|a| a.to_string_lossy().into_owned()))
            .collect();
        println!("{}", words.join(" "));
        return ExitCode::SUCCESS;
    }
    let error = command.exec();
    eprintln!(
        "hmcc: cannot run the C compiler `{compiler}` (set HMCC_CC or CC to choose another): \
         {error}"
    );
    ExitCode::FAILURE
}

/// The compiler to run: `$HMCC_CC`; else `$CC` unless it is this wrapper (`CC=hmcc ./configure`
/// exports `CC=hmcc` to the build, and running it would call this wrapper again forever); else
/// `cc`.
fn compiler(me: &Path) -> String {
    if let Ok(chosen) = std::env::var("HMCC_CC") {
        return chosen;
    }
    match std::env::var("CC") {
        Ok(cc) if !cc.is_empty() && !is_this_wrapper(&cc, me) => cc,
        _ => "cc".to_string(),
    }
}

/// True if the compiler `cc` (a path, or a name found on `PATH`) is this executable, `me`, or is
/// called `hmcc`.
fn is_this_wrapper(cc: &str, me: &Path) -> bool {
    let path = Path::new(cc);
    if path.file_name().is_some_and(|name| name == "hmcc") {
        return true;
    }
    let found = if cc.contains('/') {
        Some(path.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(cc))
                .find(|candidate| candidate.is_file())
        })
    };
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    found.is_some_and(|found| canonical(&found).is_some() && canonical(&found) == canonical(me))
}
